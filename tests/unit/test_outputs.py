"""Output directories (eaglewire.outputs): the marker, what a command may write, outputs from before
markers, and the whole-directory replacement. In-process and cheap: every command's own cases run
as subprocesses in tests/faults/cases_outputs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.output_marker import (
    LEGACY,
    MARKER_FILE,
    OutputKind,
    read_marker,
    recognise,
    update_marker,
    verify_files,
    write_marker,
)
from eaglewire.outputs import (
    check_output_dir,
    check_output_file,
    check_resumable_dir,
    claim_output_dir,
    fresh_output,
    replacing_dir,
)


def _files(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("__", ".")).write_text(text)
    return directory


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _draft(directory: Path, weights: str = "w") -> Path:
    _files(directory, config__json="{}", model__safetensors=weights, contract__json="{}")
    write_marker(directory, OutputKind.DRAFT, ["config.json", "model.safetensors", "contract.json"])
    return directory


def test_marker_round_trip_and_verify(tmp_path: Path) -> None:
    d = _draft(tmp_path / "d")
    marker = read_marker(d)
    assert marker is not None and marker.kind is OutputKind.DRAFT
    assert set(marker.files) == {"config.json", "model.safetensors", "contract.json"}
    verify_files(d)
    (d / "model.safetensors").write_text("x")  # same size, other bytes
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256"):
        verify_files(d)
    (d / "model.safetensors").write_text("")
    with pytest.raises(CheckpointError, match=r"size: expected 1 bytes"):
        verify_files(d)


def test_read_marker_refuses_a_foreign_file(tmp_path: Path) -> None:
    _files(tmp_path, eaglewire__json='{"format": "something-else"}')
    with pytest.raises(CheckpointError, match="format: expected 'eaglewire-output'"):
        read_marker(tmp_path)


def test_missing_or_empty_directories_are_free(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "new", OutputKind.DRAFT, force=False) is False
    (tmp_path / "empty").mkdir()
    assert check_output_dir(tmp_path / "empty", OutputKind.DRAFT, force=False) is False
    assert check_resumable_dir(tmp_path / "empty", OutputKind.TRAIN_RUN) is None


def test_a_foreign_directory_is_refused_force_or_not(tmp_path: Path) -> None:
    target = _files(tmp_path / "target", config__json="{}", model__safetensors="w", tokenizer__json="{}")
    for force in (False, True):
        with pytest.raises(ConfigError, match=r"not empty and not an eaglewire output \(holds config\.json"):
            check_output_dir(target, OutputKind.EXPORT_SGLANG, force=force)
    with pytest.raises(ConfigError, match="not an eaglewire output"):
        check_resumable_dir(target, OutputKind.TRAIN_RUN)


def test_another_kind_is_refused_force_or_not(tmp_path: Path) -> None:
    d = _draft(tmp_path / "d")
    with pytest.raises(ConfigError, match="holds an eaglewire draft, not an SGLang export"):
        check_output_dir(d, OutputKind.EXPORT_SGLANG, force=True)
    with pytest.raises(ConfigError, match="holds an eaglewire draft, not a training run"):
        check_resumable_dir(d, OutputKind.TRAIN_RUN)


def test_the_same_kind_needs_force(tmp_path: Path) -> None:
    d = _draft(tmp_path / "d")
    with pytest.raises(ConfigError, match="holds an earlier eaglewire draft") as e:
        check_output_dir(d, OutputKind.DRAFT, force=False)
    assert e.value.fix is not None and "--force" in e.value.fix
    assert check_output_dir(d, OutputKind.DRAFT, force=True) is True


def test_a_file_and_a_directory_inside_an_output_are_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_output_dir(tmp_path / "f", OutputKind.DRAFT, force=True)
    d = _draft(tmp_path / "d")
    with pytest.raises(ConfigError, match=r"inside .*, an eaglewire draft"):
        check_output_dir(d / "sub" / "export", OutputKind.EXPORT_VLLM, force=True)
    # a run directory holds other outputs: a draft inside a training run is fine
    claim_output_dir(tmp_path / "run", OutputKind.TRAIN_RUN)
    assert check_output_dir(tmp_path / "run" / "export", OutputKind.EXPORT_VLLM, force=False) is False


def test_outputs_from_before_markers_are_recognised_by_their_files(tmp_path: Path) -> None:
    cases = {
        OutputKind.DRAFT: {"config__json": "{}", "model__safetensors": "w", "contract__json": "{}"},
        OutputKind.EXPORT_VLLM: {
            "config__json": "{}",
            "model__safetensors": "w",
            "contract__json": "{}",
            "export__json": '{"format": "vllm"}',
            "launch_vllm__sh": "",
        },
        OutputKind.DATASET: {"tokens__safetensors": "t", "index__json": "{}", "draft_vocab__json": "{}"},
        OutputKind.VOCAB: {"draft_vocab__safetensors": "v", "draft_vocab__json": "{}"},
        OutputKind.SHARDS: {"manifest__json": '{"format": "eaglewire-hidden-state-shards"}', "x__bin": ""},
        OutputKind.TRAIN_RUN: {"train_config__json": "{}", "metrics__jsonl": ""},
        OutputKind.QUICKSTART_RUN: {"preset__json": "{}", "target__json": "{}"},
    }
    for kind, files in cases.items():
        found = recognise(_files(tmp_path / kind.value, **files))
        assert found is not None and (found.kind, found.marked) == (kind, False), kind
    # one file too many, a probe that fails, a mixed export: none of them
    assert recognise(_files(tmp_path / "x1", config__json="{}", model__safetensors="w", contract__json="{}",
                            notes__txt="")) is None  # fmt: skip
    assert recognise(_files(tmp_path / "x2", manifest__json='{"format": "other"}')) is None
    mixed = {**cases[OutputKind.EXPORT_VLLM], "launch_sglang__sh": ""}
    assert recognise(_files(tmp_path / "x3", **mixed)) is None
    assert set(LEGACY) == set(OutputKind)


def test_legacy_file_names_are_the_writers(tmp_path: Path) -> None:
    """outputs.py spells the writers' file names itself (it imports no torch): they must agree."""
    from eaglewire.contract.contract import CONTRACT_FILE
    from eaglewire.data.records import INDEX_FILE, TOKENS_FILE
    from eaglewire.data.shards import MANIFEST_FILE, MANIFEST_FORMAT
    from eaglewire.data.vocab import VOCAB_FILES
    from eaglewire.draft.io import DRAFT_FILES
    from eaglewire.export.exporting import EXPORT_KINDS, export_files
    from eaglewire.train.checkpoint import CHECKPOINT_FILES
    from eaglewire.train.config import TRAIN_CONFIG_FILE

    assert LEGACY[OutputKind.DRAFT].required == set(DRAFT_FILES) and CONTRACT_FILE in DRAFT_FILES
    assert LEGACY[OutputKind.TRAIN_CHECKPOINT].required == set(CHECKPOINT_FILES)
    for fmt, kind in EXPORT_KINDS.items():
        assert LEGACY[kind].required == set(export_files(fmt))
    assert LEGACY[OutputKind.DATASET].required == {INDEX_FILE, TOKENS_FILE}
    assert LEGACY[OutputKind.VOCAB].required == set(VOCAB_FILES)
    assert LEGACY[OutputKind.SHARDS].required == {MANIFEST_FILE}
    probe = LEGACY[OutputKind.SHARDS].probe
    assert probe is not None and probe(
        _files(tmp_path, manifest__json=json.dumps({"format": MANIFEST_FORMAT}))
    )
    assert LEGACY[OutputKind.TRAIN_RUN].required == {TRAIN_CONFIG_FILE}


def test_claim_marks_a_new_and_an_old_run_and_keeps_its_files(tmp_path: Path) -> None:
    new = tmp_path / "new"
    claim_output_dir(new, OutputKind.TRAIN_RUN)
    assert _entries(new) == [MARKER_FILE] and recognise(new) is not None
    old = _files(tmp_path / "old", train_config__json='{"a": 1}')
    claim_output_dir(old, OutputKind.TRAIN_RUN)
    marker = read_marker(old)
    assert marker is not None and marker.kind is OutputKind.TRAIN_RUN
    assert (old / "train_config.json").read_text() == '{"a": 1}'
    claim_output_dir(old, OutputKind.TRAIN_RUN)  # again: resumes
    with pytest.raises(ConfigError, match="holds a training run, not a quickstart run"):
        claim_output_dir(old, OutputKind.QUICKSTART_RUN)


def test_fresh_output_builds_beside_and_renames(tmp_path: Path) -> None:
    out = tmp_path / "export"
    with fresh_output(out, OutputKind.EXPORT_SGLANG, force=False) as tmp:
        assert tmp.parent == tmp_path and tmp != out and not out.exists()
        (tmp / "a.json").write_text("1")
    assert _entries(out) == ["a.json", MARKER_FILE]
    assert _entries(tmp_path) == ["export"]  # no temporary directory left
    plain = tmp_path / "plain"
    plain.mkdir()
    assert out.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkdtemp's owner-only mode
    plain.rmdir()
    with (
        pytest.raises(ConfigError, match="holds an earlier SGLang export"),
        fresh_output(out, OutputKind.EXPORT_SGLANG, force=False),
    ):
        raise AssertionError("not reached: refused before the block")
    with fresh_output(out, OutputKind.EXPORT_SGLANG, force=True) as tmp:
        (tmp / "b.json").write_text("2")
    assert _entries(out) == ["b.json", MARKER_FILE]  # replaced whole: a.json is gone
    assert _entries(tmp_path) == ["export"]


def test_fresh_output_changes_nothing_when_the_block_fails(tmp_path: Path) -> None:
    out = tmp_path / "export"
    with fresh_output(out, OutputKind.EXPORT_VLLM, force=False) as tmp:
        (tmp / "a.json").write_text("1")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with (
        pytest.raises(RuntimeError, match="disk full"),
        fresh_output(out, OutputKind.EXPORT_VLLM, force=True) as tmp,
    ):
        (tmp / "b.json").write_text("half")
        raise RuntimeError("disk full")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _entries(tmp_path) == ["export"]
    with pytest.raises(RuntimeError), fresh_output(tmp_path / "new", OutputKind.DRAFT, force=False):
        raise RuntimeError("failed")
    assert _entries(tmp_path) == ["export"]


def test_fresh_output_into_an_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "d"
    out.mkdir()
    with fresh_output(out, OutputKind.VOCAB, force=False) as tmp:
        (tmp / "draft_vocab.json").write_text("{}")
    assert _entries(out) == ["draft_vocab.json", MARKER_FILE]


def test_replacing_dir_replaces_whatever_is_there(tmp_path: Path) -> None:
    out = _files(tmp_path / "run" / "draft", old__txt="old", keep__txt="k")
    with replacing_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _entries(out) == ["new.txt"]
    assert _entries(tmp_path / "run") == ["draft"]


def test_update_marker_adds_files_and_marks_an_old_output(tmp_path: Path) -> None:
    ds = _files(tmp_path / "ds", tokens__safetensors="t", index__json="{}")
    _files(ds, draft_vocab__safetensors="v", draft_vocab__json="{}")
    marker = update_marker(ds, OutputKind.DATASET, ["draft_vocab.safetensors", "draft_vocab.json"])
    assert set(marker.files) == {
        "tokens.safetensors",
        "index.json",
        "draft_vocab.safetensors",
        "draft_vocab.json",
    }
    verify_files(ds)
    with pytest.raises(CheckpointError, match="kind dataset, expected vocab"):
        update_marker(ds, OutputKind.VOCAB, [])


def test_check_output_file(tmp_path: Path) -> None:
    out = tmp_path / "regen.jsonl"
    own = tmp_path / "regen.jsonl.regen.json"
    check_output_file(out, own=own, command="eaglewire data regenerate")  # missing: free
    out.write_text("")
    check_output_file(out, own=own, command="eaglewire data regenerate")  # empty: free
    out.write_text('{"id": "a"}\n')
    with pytest.raises(ConfigError, match=r"not an earlier output of eaglewire data regenerate \(no regen"):
        check_output_file(out, own=own, command="eaglewire data regenerate")
    own.write_text("{}")
    check_output_file(out, own=own, command="eaglewire data regenerate")  # its own: resumes
    with pytest.raises(ConfigError, match="is a directory"):
        check_output_file(tmp_path, own=own, command="eaglewire data regenerate")
    d = _draft(tmp_path / "d")
    with pytest.raises(ConfigError, match="inside"):
        check_output_file(d / "x.jsonl", own=own, command="eaglewire data regenerate")


def test_replacing_without_an_atomic_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2(RENAME_EXCHANGE) is missing, the old output is moved aside, then the new one
    renamed into place: the same result."""
    import eaglewire.outputs as outputs

    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    out = _files(tmp_path / "d", old__txt="old")
    with replacing_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _entries(out) == ["new.txt"] and _entries(tmp_path) == ["d"]


def test_the_atomic_exchange_swaps_two_directories(tmp_path: Path) -> None:
    from eaglewire.outputs import _exchange

    a, b = _files(tmp_path / "a", x__txt="a"), _files(tmp_path / "b", y__txt="b")
    if not _exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert _entries(a) == ["y.txt"] and _entries(b) == ["x.txt"]


def test_a_vocabulary_beside_its_dataset(tmp_path: Path) -> None:
    """`data vocab` without --out writes beside the dataset: listed in the dataset's marker (a dataset
    from before markers gets one), replaced only with force, never beside anything but a dataset."""
    import torch

    from eaglewire.data.vocab import DraftVocab, save_vocab_beside_dataset

    vocab = DraftVocab(torch.tensor([1, 3]), {"draft_vocab_size": 2})
    ds = _files(tmp_path / "ds", tokens__safetensors="t", index__json="{}")
    save_vocab_beside_dataset(vocab, ds)
    marker = read_marker(ds)
    assert marker is not None and marker.kind is OutputKind.DATASET
    assert sorted(marker.files) == [
        "draft_vocab.json",
        "draft_vocab.safetensors",
        "index.json",
        "tokens.safetensors",
    ]
    with pytest.raises(ConfigError, match="already holds a draft vocabulary") as e:
        save_vocab_beside_dataset(vocab, ds)
    assert e.value.fix is not None and "--force" in e.value.fix
    save_vocab_beside_dataset(DraftVocab(torch.tensor([0, 2]), {}), ds, force=True)
    verify_files(ds)
    with pytest.raises(ConfigError, match="not a tokenized dataset"):
        save_vocab_beside_dataset(vocab, _draft(tmp_path / "d"))
