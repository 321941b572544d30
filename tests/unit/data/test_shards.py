"""Offline capture into shards: values, manifest, resume, checksum failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglewire.contract.contract import Contract
from eaglewire.contract.fingerprint import StateKey
from eaglewire.data.build import build_dataset
from eaglewire.data.capture import capture_dataset, estimate_storage
from eaglewire.data.formats import Conversation, Message
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import (
    JOURNAL_FILE,
    MANIFEST_FILE,
    ShardDataset,
    ShardWriter,
    load_manifest,
    shard_file_name,
)
from eaglewire.data.types import ShardContent
from eaglewire.errors import ConfigError, ContractMismatchError, DataFormatError
from eaglewire.target.capture import capture_all
from tests.helpers.tiny import make_tiny_target, tiny_tokenizer

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "and",
    "then",
    "some",
    "more",
    "numbers",
    "1",
    "2",
    "3",
]


def convs(n: int) -> list[Conversation]:
    return [
        Conversation(
            f"c{i}",
            (
                Message("user", " ".join(WORDS[: 3 + i % 7])),
                Message("assistant", " ".join(WORDS[i % 5 : 6 + i % 9])),
            ),
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    return make_tiny_target("llama", num_layers=8)


@pytest.fixture(scope="module")
def dataset() -> TokenizedDataset:
    return build_dataset(convs(11), tiny_tokenizer(), max_length=64, show_progress=False)[0]


def test_capture_values_manifest_and_reader(tmp_path: Path, target, dataset: TokenizedDataset) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "shards"
    stats = capture_dataset(target, dataset, out, shard_records=4, batch_size=3, show_progress=False)
    assert stats.shards_written == 3 and stats.records == 11 and stats.tokens == dataset.num_tokens
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert (
        manifest["complete"]
        and manifest["num_records"] == 11
        and manifest["num_tokens"] == dataset.num_tokens
    )
    assert [s["records"] for s in manifest["shards"]] == [4, 4, 3]
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in manifest["shards"])
    contract = Contract.load(out)
    assert contract.aux_boundaries == (2, 4, 5)  # L=8: 2, L//2, L-3
    assert contract.fingerprint is not None
    assert estimate_storage(dataset.num_tokens, contract) == pytest.approx(stats.written_bytes, rel=0.1)

    shards = ShardDataset(out)
    assert len(shards) == 11 and shards.record_ids() == dataset.record_ids
    Ht = target.hidden_size
    for i in (0, 5, 10):
        r = shards[i]
        assert r.record_id == dataset.record_ids[i]
        assert torch.equal(r.input_ids, dataset[i].input_ids) and torch.equal(
            r.loss_mask, dataset[i].loss_mask
        )
        ref = capture_all(target.model, r.input_ids[None])  # unpadded, alone
        for a, b in enumerate(contract.aux_boundaries):
            torch.testing.assert_close(
                r.aux[:, a * Ht : (a + 1) * Ht], ref[StateKey(b)][0], atol=1e-5, rtol=1e-4
            )
        torch.testing.assert_close(r.final, ref[StateKey(target.num_layers)][0], atol=1e-5, rtol=1e-4)


def test_resume_after_interruption(tmp_path: Path, target, dataset: TokenizedDataset) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "shards"
    capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    reference = {i: ShardDataset(out)[i] for i in range(len(dataset))}
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    # simulate a kill after the first shard: manifest lists one shard, later shard files are gone/partial
    manifest["shards"] = manifest["shards"][:1]
    manifest["complete"] = False
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    (out / shard_file_name(2)).unlink()
    with pytest.raises(DataFormatError, match="capture incomplete"):
        ShardDataset(out)
    first_mtime = (out / shard_file_name(0)).stat().st_mtime_ns
    stats = capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    assert stats.shards_resumed == 1 and stats.shards_written == 2
    assert (out / shard_file_name(0)).stat().st_mtime_ns == first_mtime  # not rewritten
    shards = ShardDataset(out, verify="eager")
    for i, r in reference.items():
        assert torch.equal(shards[i].aux, r.aux) and shards[i].record_id == r.record_id
    with pytest.raises(DataFormatError, match="holds shards of another capture"):
        capture_dataset(target, dataset, out, shard_records=5, show_progress=False)
    with pytest.raises(ContractMismatchError, match="aux_boundaries"):
        capture_dataset(target, dataset, out, shard_records=4, aux_boundaries=[1, 2, 3], show_progress=False)


def test_shards_are_journaled_and_the_manifest_written_at_start_and_finish(
    tmp_path: Path, target, dataset: TokenizedDataset
) -> None:  # type: ignore[no-untyped-def]
    """Each shard appends one journal line instead of rewriting the whole manifest (O(shards) per
    shard); readers see the two merged while a capture runs, and `finish` folds the journal in.
    A torn last line (a kill mid-append) is ignored; a bad line before the last is an error that
    names the file and line."""
    out = tmp_path / "shards"
    capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    finished = load_manifest(out)
    assert not (out / JOURNAL_FILE).exists() and finished["complete"]
    records = [ShardDataset(out)[i] for i in range(len(dataset))]

    def content(lo: int, hi: int) -> ShardContent:
        return ShardContent.from_records(records[lo:hi])

    again = tmp_path / "again"
    plan = {"test": "journal"}
    writer = ShardWriter(again, Contract.load(out), plan=plan, total_records=len(dataset))
    writer.write(1, 4, content(4, 8))
    writer.write(0, 0, content(0, 4))
    assert json.loads((again / MANIFEST_FILE).read_text())["shards"] == []  # not rewritten per shard
    assert len((again / JOURNAL_FILE).read_text().splitlines()) == 2
    merged = load_manifest(again)
    assert [s["index"] for s in merged["shards"]] == [0, 1] and not merged["complete"]
    assert merged["num_records"] == 8 and merged["num_tokens"] == sum(
        int(r.input_ids.numel()) for r in records[:8]
    )
    assert merged["shards"] == finished["shards"][:2]  # the same entries as the one-pass capture

    # a kill mid-append: the torn line is ignored, its shard counted as not written
    with open(again / JOURNAL_FILE, "a") as f:
        f.write('{"index": 2, "file": "shard_000')
    assert [s["index"] for s in load_manifest(again)["shards"]] == [0, 1]
    resumed = ShardWriter(again, Contract.load(out), plan=plan, total_records=len(dataset))
    assert resumed.done(0) and resumed.done(1) and not resumed.done(2)
    assert not (again / JOURNAL_FILE).exists()  # folded into the manifest at the start
    assert [s["index"] for s in json.loads((again / MANIFEST_FILE).read_text())["shards"]] == [0, 1]
    resumed.write(2, 8, content(8, len(dataset)))
    resumed.finish()
    assert load_manifest(again)["shards"] == finished["shards"] and not (again / JOURNAL_FILE).exists()
    assert len(ShardDataset(again, verify="eager")) == len(dataset)

    # a bad line that is not the last one is not a torn append: named, not skipped
    (again / JOURNAL_FILE).write_text('not json\n{"index": 0}\n')
    with pytest.raises(DataFormatError, match=rf"{JOURNAL_FILE}:1: not a shard entry"):
        load_manifest(again)


def test_checksum_failure_names_the_shard(tmp_path: Path, target, dataset: TokenizedDataset) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "shards"
    capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    bad = out / shard_file_name(1)
    data = bytearray(bad.read_bytes())
    data[-5] ^= 0xFF  # flip bits inside the tensor payload
    bad.write_bytes(bytes(data))
    shards = ShardDataset(out)
    shards[0]  # shard 0 is fine
    with pytest.raises(DataFormatError, match=r"shard .*shard_00001\.safetensors: sha256 mismatch"):
        shards[5]
    with pytest.raises(DataFormatError, match=r"shard_00001\.safetensors"):
        ShardDataset(out, verify="eager")
    with pytest.raises(DataFormatError, match=r"shard_00001\.safetensors: sha256 mismatch"):
        ShardDataset(out, verify="eager", verify_workers=3)  # hashed in parallel: the bad one named
    # training opens shards eagerly: the bad shard stops it before step 1, not inside a step
    from eaglewire.train.run import open_data

    with pytest.raises(DataFormatError, match=r"shard_00001\.safetensors: sha256 mismatch"):
        open_data(out)


def test_capture_refuses_other_tokenizer(tmp_path: Path, target, dataset: TokenizedDataset) -> None:  # type: ignore[no-untyped-def]
    other = TokenizedDataset(
        dataset.record_ids,
        dataset.input_ids,
        dataset.loss_mask,
        dataset.offsets,
        {**dataset.meta, "tokenizer_hash": "x" * 64},
    )
    with pytest.raises(ContractMismatchError, match="another tokenizer"):
        capture_dataset(target, other, tmp_path / "s", show_progress=False)


def test_out_of_memory_names_the_flag_and_keeps_captured_shards(
    tmp_path: Path, target, dataset: TokenizedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A batch that runs out of memory stops the capture with the flag to lower; the window captured
    before it (still in flight) is written, and the rerun resumes after it.
    window_tokens=max_window_tokens=1: each shard is its own window."""
    import eaglewire.data.capture_batches as batches_module

    real, calls = batches_module.capture, []

    def capture_then_oom(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:  # shard 2's only batch
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*args, **kwargs)

    out = tmp_path / "shards"
    monkeypatch.setattr(batches_module, "capture", capture_then_oom)
    with pytest.raises(
        ConfigError, match=r"(?s)3 records x \d+ tokens.*ran out of memory.*--max-batch-tokens"
    ):
        capture_dataset(target, dataset, out, shard_records=4, batch_size=4, window_tokens=1, max_window_tokens=1, show_progress=False)  # fmt: skip
    # interrupted: the manifest (written at the start) lists no shard, the journal the two written
    assert json.loads((out / MANIFEST_FILE).read_text())["shards"] == []
    assert [s["index"] for s in load_manifest(out)["shards"]] == [0, 1]
    monkeypatch.setattr(batches_module, "capture", real)
    stats = capture_dataset(target, dataset, out, shard_records=4, batch_size=4, show_progress=False)
    assert stats.shards_resumed == 2 and stats.shards_written == 1
    assert len(ShardDataset(out, verify="eager")) == len(dataset)


def test_a_window_is_written_while_the_next_one_is_captured(
    tmp_path: Path, target, dataset: TokenizedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A window's shards go to the writers as soon as its states are on the host, not after the
    next window's forwards: here the second window's forward waits for shard 0's file to appear
    (window_tokens=max_window_tokens=1: each shard is its own window). Were shard 0 handed over
    only after that launch, it would never appear."""
    import time

    import eaglewire.data.capture_batches as batches_module

    real, calls = batches_module.capture, []
    out = tmp_path / "shards"

    def capture_after_shard0(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:  # shard 1's only batch
            deadline = time.monotonic() + 20
            while not (out / shard_file_name(0)).exists():
                assert time.monotonic() < deadline, "shard 0 was not written while shard 1 was captured"
                time.sleep(0.01)
        return real(*args, **kwargs)

    monkeypatch.setattr(batches_module, "capture", capture_after_shard0)
    stats = capture_dataset(target, dataset, out, shard_records=4, batch_size=4, window_tokens=1, max_window_tokens=1, show_progress=False)  # fmt: skip
    assert stats.shards_written == 3 and len(ShardDataset(out, verify="eager")) == len(dataset)


def test_windows_of_several_shards_write_the_same_shards(
    tmp_path: Path, target, dataset: TokenizedDataset
) -> None:  # type: ignore[no-untyped-def]
    """Shards captured a window of several at a time (batches mixing their records) hold the same
    records, in the same shards, with the same states as shards captured one at a time; a resumed
    window captures only its missing shards."""
    one, many = tmp_path / "one", tmp_path / "many"
    capture_dataset(target, dataset, one, shard_records=3, batch_size=4, window_tokens=1, max_window_tokens=1, show_progress=False)  # fmt: skip
    capture_dataset(target, dataset, many, shard_records=3, batch_size=4, show_progress=False)  # one window
    manifests = [json.loads((d / MANIFEST_FILE).read_text())["shards"] for d in (one, many)]
    assert [(s["index"], s["first_record"], s["records"], s["tokens"]) for s in manifests[0]] == [
        (s["index"], s["first_record"], s["records"], s["tokens"]) for s in manifests[1]
    ]
    a, b = ShardDataset(one, verify="eager"), ShardDataset(many, verify="eager")
    assert a.record_ids() == b.record_ids() == list(dataset.record_ids)
    for i in range(len(dataset)):
        torch.testing.assert_close(b[i].aux, a[i].aux)
        torch.testing.assert_close(b[i].final, a[i].final)
        assert torch.equal(b[i].input_ids, a[i].input_ids) and torch.equal(b[i].loss_mask, a[i].loss_mask)
    # drop shard 2 of the window-captured run: the rerun captures it alone and nothing else
    manifest = json.loads((many / MANIFEST_FILE).read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["index"] != 2]
    manifest["complete"] = False
    (many / MANIFEST_FILE).write_text(json.dumps(manifest))
    (many / shard_file_name(2)).unlink()
    stats = capture_dataset(target, dataset, many, shard_records=3, batch_size=4, show_progress=False)
    assert stats.shards_written == 1 and stats.shards_resumed == len(manifests[0]) - 1
    assert stats.records == 3
    c = ShardDataset(many, verify="eager")
    for i in range(len(dataset)):
        torch.testing.assert_close(c[i].aux, a[i].aux)


def test_host_memory_estimate_and_the_warning_that_names_the_flags(
    tmp_path: Path,
    target,
    dataset: TokenizedDataset,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # type: ignore[no-untyped-def]
    """peak_host_bytes: the write_workers largest shards plus the two largest windows; a capture whose
    estimate exceeds a quarter of the machine's RAM warns, naming --shard-records and --write-workers."""
    import logging

    import eaglewire.data.capture as capture_module
    from eaglewire.data.capture import peak_host_bytes
    from eaglewire.target.identity import build_contract

    c = build_contract(target, fingerprint=False)
    per = estimate_storage(1, c)
    windows = [[10, 20], [30], [5, 5, 5]]
    assert peak_host_bytes(windows, 2, c) == (30 + 20) * per + (30 + 30) * per
    assert peak_host_bytes(windows, 8, c) == 75 * per + 60 * per  # fewer shards than writers: all of them
    monkeypatch.setattr(capture_module, "physical_memory_bytes", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="eaglewire.data.capture"):
        capture_dataset(target, dataset, tmp_path / "s", shard_records=4, show_progress=False)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--shard-records (now 4)" in m and "--write-workers (now 8)" in m for m in warned), warned


def test_capture_stats_break_the_wall_time_down_by_phase(
    tmp_path: Path, target, dataset: TokenizedDataset
) -> None:  # type: ignore[no-untyped-def]
    """The calling thread's phases (launch, copy wait, writer wait, drain) add up to no more than
    the wall time; the writers' time is counted; the manifest keeps them; no GPU time on a CPU."""
    out = tmp_path / "phases"
    stats = capture_dataset(target, dataset, out, shard_records=3, batch_size=4, window_tokens=1, max_window_tokens=1, show_progress=False)  # fmt: skip
    phases = [stats.launch_seconds, stats.copy_wait_seconds, stats.writer_wait_seconds, stats.drain_seconds]
    assert stats.launch_seconds > 0 and stats.writer_thread_seconds > 0
    assert all(p >= 0 for p in phases) and sum(phases) <= stats.seconds
    assert stats.gpu_forward_seconds == 0.0
    recorded = json.loads((out / MANIFEST_FILE).read_text())["capture_stats"]
    assert recorded["writer_thread_seconds"] == stats.writer_thread_seconds
    assert "writer wait" in stats.phases() and "drain" in stats.phases()


def test_pacing_the_launches_changes_no_shard_and_refuses_a_negative_depth(
    tmp_path: Path, target, dataset: TokenizedDataset
) -> None:  # type: ignore[no-untyped-def]
    """pace_batches only makes the host wait for the GPU (no events on a CPU): the same shard files;
    a negative depth is refused naming the argument before anything is written."""
    plain, paced = tmp_path / "plain", tmp_path / "paced"
    capture_dataset(target, dataset, plain, shard_records=3, batch_size=4, show_progress=False, pace_batches=0)  # fmt: skip
    stats = capture_dataset(target, dataset, paced, shard_records=3, batch_size=4, show_progress=False, pace_batches=1)  # fmt: skip
    assert stats.pace_wait_seconds == 0.0 and "pace wait" in stats.phases()
    shards = sorted(p.name for p in plain.glob("*.safetensors"))
    assert shards == sorted(p.name for p in paced.glob("*.safetensors")) and shards
    for name in shards:
        assert (plain / name).read_bytes() == (paced / name).read_bytes(), name
    with pytest.raises(ConfigError, match="pace_batches.*-1"):
        capture_dataset(target, dataset, tmp_path / "bad", show_progress=False, pace_batches=-1)
    assert not (tmp_path / "bad").exists()


def test_windows_shrink_towards_the_end_and_the_last_holds_one_shard_per_writer(
    tmp_path: Path, target, dataset: TokenizedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """capture_dataset launches the windows `capture_windows` plans from the shards' token counts:
    half of what is left between the floor and the ceiling, the last one at most `write_workers`
    shards; the shards written are the same whatever the windows."""
    import eaglewire.data.capture as capture_module
    from eaglewire.data.batching import capture_windows

    real, launched = capture_module.launch_shards, []

    def spy(target, dataset, groups, *args, **kwargs):  # type: ignore[no-untyped-def]
        launched.append([g[0] for g in groups])  # each group's first record: which shards
        return real(target, dataset, groups, *args, **kwargs)

    monkeypatch.setattr(capture_module, "launch_shards", spy)
    lengths = dataset.lengths()
    shard_tokens = [int(lengths[k : k + 1].sum()) for k in range(len(dataset))]
    floor = max(shard_tokens)
    stats = capture_dataset(target, dataset, tmp_path / "s", shard_records=1, batch_size=4, window_tokens=floor, max_window_tokens=4 * floor, write_workers=2, show_progress=False)  # fmt: skip
    planned = capture_windows(shard_tokens, floor, 4 * floor, last_window_shards=2)
    assert launched == planned and len(planned) >= 3, planned
    assert len(planned[0]) > len(planned[-2]) and len(planned[-1]) <= 2
    assert stats.shards_written == len(dataset)
    assert ShardDataset(tmp_path / "s", verify="eager").record_ids() == list(dataset.record_ids)


def test_a_capture_that_cannot_fit_its_disk_stops_before_the_first_forward(  # type: ignore[no-untyped-def]
    tmp_path: Path, target, dataset: TokenizedDataset, monkeypatch
) -> None:
    """The free-space figure is the one input faked here: the disk has room for one shard of three.
    The refusal names the directory, both sizes and the ways out; a resumed capture only counts the
    shards it still has to write."""
    import collections
    import shutil

    out = tmp_path / "shards"
    capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    whole = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:2], False  # shards 0 and 1 kept
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    (out / shard_file_name(2)).unlink()
    usage = collections.namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(*real(p)[:2], whole // 8))
    calls = []
    monkeypatch.setattr("eaglewire.data.capture.launch_shards", lambda *a, **k: calls.append(1))
    with pytest.raises(
        ConfigError, match=r"the 1 shards still to capture need about .* is free on that disk"
    ) as err:
        capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    assert str(out) in str(err.value) and "train online" in str(err.value)
    assert calls == [] and (out / shard_file_name(0)).exists()  # nothing run, nothing lost
    monkeypatch.undo()
    stats = capture_dataset(target, dataset, out, shard_records=4, show_progress=False)
    assert stats.shards_resumed == 2 and stats.shards_written == 1
