"""Validated safetensors reading, non-finite and vocab-map checks, and draft file verification
(issue 43 item 4), in process: each damage the fault cases inject end to end, plus the finer ones."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.draft.config import DraftConfig
from eaglewire.draft.io import WEIGHTS_FILE, load_draft_weights, verify_draft_files
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError, ConfigError, DataFormatError, TargetFilesError
from eaglewire.output_marker import OutputKind, write_marker
from eaglewire.safetensors_io import load_tensors, open_tensors, read_header
from eaglewire.tensor_checks import check_finite, check_vocab_map, nonfinite


def _file(tmp_path: Path, name: str = "w.safetensors") -> Path:
    path = tmp_path / name
    save_file(
        {
            "a": torch.zeros(4, 3),
            "b": torch.arange(5, dtype=torch.int64),
            "c": torch.ones(2, dtype=torch.bfloat16),
        },
        str(path),
        metadata={"producer": "test"},
    )
    return path


def _raw(header: dict, data: bytes) -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


# --- read_header ---
def test_header_of_a_valid_file(tmp_path: Path) -> None:
    h = read_header(_file(tmp_path))
    assert set(h.tensors) == {"a", "b", "c"}
    assert h.tensors["a"].shape == (4, 3) and h.tensors["a"].dtype == "F32"
    assert h.metadata == {"producer": "test"}
    assert h.file_bytes == 8 + h.header_bytes + 48 + 40 + 4


def test_cut_file_names_the_tensor_it_cuts(tmp_path: Path) -> None:
    path = _file(tmp_path)
    h = read_header(path)
    b = h.tensors["b"]
    path.write_bytes(path.read_bytes()[: h.data_start + b.start + 3])
    pattern = rf"tensor 'b' \(data bytes {b.start}\.\.{b.end}\) lies past the end.*cut short"
    with pytest.raises(DataFormatError, match=pattern) as e:
        read_header(path, error=DataFormatError)
    assert str(path) in str(e.value)


def test_bytes_after_the_last_tensor(tmp_path: Path) -> None:
    path = _file(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0" * 5)
    with pytest.raises(CheckpointError, match="5 bytes after the last tensor"):
        read_header(path)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x01\x02", "too short"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "Git LFS pointer"),
        (b"\x80\x04\x95" + b"\0" * 40, "Python pickle"),
        (struct.pack("<Q", 4) + b"{no}", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "expected an object"),
    ],
)
def test_not_safetensors(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=says):
        read_header(path)


def test_torch_save_pickle_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    torch.save({"fc.weight": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="zip archive: a torch.save pickle"):
        load_tensors(path)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}, "dtype 'F33'"),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "non-negative integers"),
        (
            {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
            r"needs 12 bytes, its data_offsets \[0, 8\] span 8",
        ),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "begin <= end"),
    ],
)
def test_bad_entries_name_the_tensor(tmp_path: Path, entry: dict, says: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(_raw({"t": entry}, b"\0" * 8))
    with pytest.raises(CheckpointError, match=f"tensor 't': .*{says}"):
        read_header(path)


def test_gap_and_overlap(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    f32 = {"dtype": "F32", "shape": [1]}
    path.write_bytes(
        _raw({"p": {**f32, "data_offsets": [0, 4]}, "q": {**f32, "data_offsets": [8, 12]}}, b"\0" * 12)
    )
    with pytest.raises(CheckpointError, match="tensor 'q': data_offsets start at 8, expected 4.*gap"):
        read_header(path)
    path.write_bytes(
        _raw({"p": {**f32, "data_offsets": [0, 4]}, "q": {**f32, "data_offsets": [2, 6]}}, b"\0" * 6)
    )
    with pytest.raises(CheckpointError, match="tensor 'q'.*overlaps"):
        read_header(path)


def test_missing_file_and_error_kind(tmp_path: Path) -> None:
    with pytest.raises(TargetFilesError, match="file not found"):
        read_header(tmp_path / "none.safetensors", error=TargetFilesError)
    with pytest.raises(DataFormatError, match="use this fix"):
        (tmp_path / "short.safetensors").write_bytes(b"1")
        read_header(tmp_path / "short.safetensors", error=DataFormatError, fix="use this fix")


def test_load_and_open_read_the_tensors(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert torch.equal(load_tensors(path)["b"], torch.arange(5))
    with open_tensors(path) as f:
        assert f.get_slice("a").get_shape() == [4, 3]


# --- non-finite values ---
def test_check_finite_names_tensor_count_and_first_index() -> None:
    t = torch.zeros(3, 4)
    t[1, 2] = float("nan")
    t[2, 0] = float("inf")
    with pytest.raises(CheckpointError) as e:
        check_finite({"ok": torch.zeros(2), "fc.weight": t, "ids": torch.arange(3)}, where="W", fix="F")
    msg = str(e.value)
    assert (
        "tensor 'fc.weight' (3, 4): 2 of 12 values are not finite (1 NaN, 1 inf); the first is [1, 2] = nan"
        in msg
    )
    assert "'ok'" not in msg and msg.startswith("W: non-finite weights") and "fix: F" in msg
    check_finite({"ok": torch.ones(3, dtype=torch.bfloat16)}, where="W", fix="F")


def test_nonfinite_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("eaglewire.tensor_checks.FINITE_CHUNK", 4)
    t = torch.zeros(10)
    t[6] = -float("inf")
    t[9] = float("nan")
    assert nonfinite(t) == (2, 1, 1, 6)
    assert nonfinite(torch.zeros(10)) is None


# --- vocab map ---
def test_vocab_map_range_names_first_bad_entry() -> None:
    with pytest.raises(
        ConfigError, match=r"M: draft_to_target\[2\] = 10: target ids must be in 0\.\.9 .*2 of 5"
    ):
        check_vocab_map(torch.tensor([0, 1, 10, 3, -1]), 10, where="M", error=ConfigError)
    with pytest.raises(CheckpointError, match=r"draft_to_target\[1\] = -1: target ids must be non-negative"):
        check_vocab_map(torch.tensor([5, -1]), None, where="M")


def test_vocab_map_repeat_names_both_entries() -> None:
    with pytest.raises(CheckpointError, match=r"draft_to_target\[3\] = 7 repeats draft_to_target\[1\]"):
        check_vocab_map(torch.tensor([0, 7, 9, 7, 9]), 10, where="M")
    check_vocab_map(torch.tensor([3, 1, 2]), 4, where="M")  # any order, each id once


def test_vocab_map_shape_and_dtype() -> None:
    with pytest.raises(CheckpointError, match="1-D"):
        check_vocab_map(torch.zeros(2, 2, dtype=torch.long), 10, where="M")
    with pytest.raises(CheckpointError, match="integer target ids"):
        check_vocab_map(torch.zeros(2), 10, where="M")


# --- draft weights and files ---
@pytest.fixture
def tiny_draft() -> Eagle3Draft:
    cfg = DraftConfig(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=40,
        draft_vocab_size=20,
        target_hidden_size=16,
        num_aux=3,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=64,
    )
    return Eagle3Draft(cfg)


def _save(draft: Eagle3Draft, directory: Path, **edits: torch.Tensor) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in draft.state_dict().items()} | edits
    save_file(state, str(directory / WEIGHTS_FILE))
    return directory / WEIGHTS_FILE


def test_load_draft_weights_refuses_nan_and_bad_map(tiny_draft: Eagle3Draft, tmp_path: Path) -> None:
    fc = tiny_draft.fc.weight.detach().clone()
    fc[0, 5] = float("nan")
    with pytest.raises(
        CheckpointError, match=r"(?s)model.safetensors: non-finite.*'fc.weight'.*\[0, 5\] = nan"
    ):
        load_draft_weights(tiny_draft, _save(tiny_draft, tmp_path / "nan", **{"fc.weight": fc}))
    d2t = torch.arange(20)
    d2t[4] = 40
    with pytest.raises(CheckpointError, match=r"draft_to_target\[4\] = 40: target ids must be in 0\.\.39"):
        load_draft_weights(tiny_draft, _save(tiny_draft, tmp_path / "map", draft_to_target=d2t))
    load_draft_weights(tiny_draft, _save(tiny_draft, tmp_path / "ok"))


def test_verify_draft_files(
    tiny_draft: Eagle3Draft, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = _save(tiny_draft, tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="eaglewire.draft.io"):
        verify_draft_files(tmp_path)  # saved before markers: loaded, with a warning
    assert "cannot be verified" in caplog.text
    write_marker(tmp_path, OutputKind.DRAFT, ["config.json", WEIGHTS_FILE])
    verify_draft_files(tmp_path)
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors: sha256: expected"):
        verify_draft_files(tmp_path)
    weights.write_bytes(bytes(data[:-100]))  # cut: the header check names the tensor before the size check
    with pytest.raises(CheckpointError, match="tensor '.*' .*lies past the end"):
        verify_draft_files(tmp_path)


# --- targets: headers checked before transformers opens the weights ---
def _target_dir(tmp_path: Path) -> Path:
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    save_file(
        {"model.norm.weight": torch.ones(8), "lm_head.weight": torch.zeros(4, 8)},
        str(d / "model.safetensors"),
    )
    return d


def test_target_weights_cut_or_missing_from_index(tmp_path: Path) -> None:
    from eaglewire.target.loading import check_target_dir

    d = _target_dir(tmp_path)
    check_target_dir(d)
    (d / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"lm_head.weight": "model.safetensors", "model.embed.weight": "model.safetensors"}}
        )
    )
    with pytest.raises(TargetFilesError, match="lists tensor 'model.embed.weight' in model.safetensors"):
        check_target_dir(d)
    (d / "model.safetensors.index.json").unlink()
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(TargetFilesError, match=r"target/model.safetensors: tensor '.*' .*cut short"):
        check_target_dir(d)


def test_gguf_magic_and_version(tmp_path: Path) -> None:
    from eaglewire.target.gguf import check_gguf_file

    path = tmp_path / "m.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 20)
    with pytest.raises(TargetFilesError, match="does not start with the GGUF magic"):
        check_gguf_file(path)
    path.write_bytes(b"GGUF" + struct.pack("<I", 99) + b"\0" * 16)
    with pytest.raises(TargetFilesError, match="version 99"):
        check_gguf_file(path)
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\0" * 16)
    check_gguf_file(path)


# --- the data vocabulary file ---
def test_vocab_file_checks(tmp_path: Path) -> None:
    from eaglewire.data.vocab import DRAFT_VOCAB_JSON, DRAFT_VOCAB_TENSORS, load_draft_vocab, read_vocab_map

    with pytest.raises(DataFormatError, match="--vocab-map .*none.safetensors: no such file"):
        read_vocab_map(tmp_path / "none.safetensors", flag="--vocab-map")
    save_file({"draft_to_target": torch.tensor([0, 5, 3, 9])}, str(tmp_path / DRAFT_VOCAB_TENSORS))
    assert read_vocab_map(tmp_path)[0].tolist() == [0, 5, 3, 9]  # V unknown: any order, each id once
    with pytest.raises(DataFormatError, match=r"draft_to_target\[2\] = 3 follows draft_to_target\[1\] = 5"):
        load_draft_vocab(tmp_path)
    (tmp_path / DRAFT_VOCAB_JSON).write_text(json.dumps({"vocab_size": 8}))
    with pytest.raises(DataFormatError, match=r"draft_to_target\[3\] = 9: target ids must be in 0\.\.7"):
        read_vocab_map(tmp_path)


# --- checkpoints: the optimizer index and its tensors ---
def test_optimizer_index_mismatch_is_named(tmp_path: Path) -> None:
    from eaglewire.train.checkpoint import _optimizer_state

    index = {"params": ["fc.weight"], "param_groups": [{"lr": 1.0, "params": ["fc.weight"]}], "scalars": {}}
    ok = _optimizer_state(tmp_path, {"0.exp_avg": torch.zeros(2)}, index)
    assert set(ok["state"]["fc.weight"]) == {"exp_avg"}
    with pytest.raises(
        CheckpointError, match=r"tensor '3.exp_avg' names no parameter of the index \(1 parameters"
    ):
        _optimizer_state(tmp_path, {"3.exp_avg": torch.zeros(2)}, index)
    with pytest.raises(CheckpointError, match="'params' and 'param_groups' lists expected"):
        _optimizer_state(tmp_path, {}, {"params": "x"})


def test_target_error_kind_is_kept_for_every_damage(tmp_path: Path) -> None:
    """TargetFilesError is also a FileNotFoundError: a damaged file must not read as a missing one."""
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(TargetFilesError, match="not a safetensors file .*zip archive"):
        read_header(path, error=TargetFilesError)
    path.write_bytes(b"\0\0")
    with pytest.raises(TargetFilesError, match="too short"):
        read_header(path, error=TargetFilesError)
