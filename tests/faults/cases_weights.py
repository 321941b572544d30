"""Damaged weights (issue 43 item 4): every safetensors load names the file and the tensor, draft
weights are checked for NaN/inf and the vocab map for range and repeats, and a draft's files are
verified against the sha256 its marker records. Each fault is injected the way it happens in the
field: a copy cut short, a pickle under the safetensors name, a flipped byte, a tensor rewritten
with NaN by a run that diverged (its marker then records the NaN file: eaglewire wrote it)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load, save_file

from tests.faults.harness import Case

DRAFT = "qs/train/draft"
DRAFT_FILES = ("config.json", "model.safetensors", "contract.json")
EVAL = "eval --target {ws}/target --draft {ws}/qs/train/draft --data {ws}/qs/data/eval_shards --num-steps 2"
GENERATE = "generate --target {ws}/target --draft {ws}/qs/train/draft --prompt hi --max-new-tokens 4"
RESUME = (
    "train --target {ws}/target --data {ws}/qs/data/train_shards --out {ws}/qs/train --resume "
    "--config {ws}/qs/train/train_config.json"
)


def _read(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors in memory (not mapped: the file is rewritten while they are alive)."""
    return load(path.read_bytes())


def _data_start(path: Path, tensor: str) -> int:
    """The byte offset in `path` where `tensor`'s data starts (read from the safetensors header)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return 8 + n + int(header[tensor]["data_offsets"][0])


def _cut_inside(rel: str, tensor: str) -> Callable[[Path], None]:
    """Truncate the file 8 bytes into `tensor`'s data (a copy that stopped there)."""

    def setup(ws: Path) -> None:
        path = ws / rel
        data = path.read_bytes()
        path.write_bytes(data[: _data_start(path, tensor) + 8])

    return setup


def _ensure_marker(draft: Path) -> None:
    """A draft as `save_draft` writes it now: with its marker (the base may predate markers)."""
    from eaglewire.output_marker import OutputKind, read_marker, write_marker

    if read_marker(draft) is None:
        write_marker(draft, OutputKind.DRAFT, DRAFT_FILES)


def _rewrite_draft(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    """Rewrite the draft's weights with `edit` applied and its marker re-recorded: what a run that
    saved such weights leaves (the checksums match; the values are what is wrong)."""

    def setup(ws: Path) -> None:
        from eaglewire.output_marker import OutputKind, write_marker

        draft = ws / DRAFT
        state = _read(draft / "model.safetensors")
        edit(state)
        save_file(state, str(draft / "model.safetensors"), metadata={"format": "pt", "producer": "eaglewire"})
        write_marker(draft, OutputKind.DRAFT, DRAFT_FILES)

    return setup


def _nan_in_fc(state: dict[str, torch.Tensor]) -> None:
    state["fc.weight"][1, 2] = float("nan")
    state["fc.weight"][3, 4] = float("nan")


def _beyond_float16(state: dict[str, torch.Tensor]) -> None:
    state["fc.weight"][2, 3] = 1e6  # finite in float32; float16 ends at 65504


def _out_of_range_id(state: dict[str, torch.Tensor]) -> None:
    state["draft_to_target"][5] = 384 + 3  # the tiny target's V is 384


def _pickle_weights(ws: Path) -> None:
    path = ws / DRAFT / "model.safetensors"
    torch.save(_read(path), path)  # what `torch.save(model.state_dict(), "model.safetensors")` leaves


def _flip_byte(ws: Path) -> None:
    draft = ws / DRAFT
    _ensure_marker(draft)
    path = draft / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[_data_start(path, "fc.weight") + 101] ^= 0x10
    path.write_bytes(bytes(data))


def _duplicate_vocab_id(ws: Path) -> None:
    path = ws / "qs/data/vocab/draft_vocab.safetensors"
    d2t = _read(path)["draft_to_target"]
    d2t[7] = d2t[3]
    save_file({"draft_to_target": d2t}, str(path))


def _intact(ws: Path) -> None:
    _ensure_marker(ws / DRAFT)


CASES = [
    Case("weights:intact-draft", GENERATE, 0, says=("speculative decoding",), setup=_intact),
    Case(
        "weights:draft-truncated",
        "doctor --draft {ws}/qs/train/draft",
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "tensor 'fc.weight'", "cut short"),
        setup=_cut_inside(f"{DRAFT}/model.safetensors", "fc.weight"),
    ),
    Case(
        "weights:draft-is-a-pickle",
        GENERATE,
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "not a safetensors file", "pickle"),
        setup=_pickle_weights,
    ),
    Case(
        "weights:target-truncated",
        "generate --target {ws}/target --prompt hi --max-new-tokens 4",
        2,
        says=("{ws}/target/model.safetensors", "tensor 'model.layers.3.mlp.up_proj.weight'", "cut short"),
        setup=_cut_inside("target/model.safetensors", "model.layers.3.mlp.up_proj.weight"),
    ),
    Case(
        "weights:draft-nan-eval",
        EVAL,
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "tensor 'fc.weight'", "2 NaN", "[1, 2] = nan"),
        setup=_rewrite_draft(_nan_in_fc),
    ),
    Case(
        "weights:draft-nan-export",
        "export --draft {ws}/qs/train/draft --format sglang --out {ws}/export-nan",
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "tensor 'fc.weight'", "2 NaN"),
        setup=_rewrite_draft(_nan_in_fc),
    ),
    Case(
        "weights:export-overflows-float16",
        "export --draft {ws}/qs/train/draft --format vllm --out {ws}/export-f16 --dtype float16",
        2,
        says=(
            "{ws}/qs/train/draft exported as vllm in float16",
            "tensor 'fc.weight'",
            "[2, 3] = inf",
            "--dtype",
        ),
        setup=_rewrite_draft(_beyond_float16),
    ),
    Case(
        "weights:draft-vocab-out-of-range",
        GENERATE,
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "draft_to_target[5] = 387", "0..383"),
        setup=_rewrite_draft(_out_of_range_id),
    ),
    Case(
        "weights:draft-flipped-byte",
        EVAL,
        2,
        says=("{ws}/qs/train/draft/model.safetensors", "sha256", "eaglewire.json"),
        setup=_flip_byte,
    ),
    Case(
        "weights:vocab-map-duplicate",
        "draft init --target {ws}/target --out {ws}/new-draft --vocab-map {ws}/qs/data/vocab/draft_vocab.safetensors",
        2,
        says=(
            "--vocab-map {ws}/qs/data/vocab/draft_vocab.safetensors",
            "draft_to_target[7]",
            "repeats draft_to_target[3]",
        ),
        setup=_duplicate_vocab_id,
    ),
    Case(
        "weights:vocab-map-missing",
        "draft init --target {ws}/target --out {ws}/new-draft --vocab-map {ws}/no-such-vocab.safetensors",
        2,
        says=("--vocab-map {ws}/no-such-vocab.safetensors", "no such file", "eaglewire data vocab"),
    ),
    Case(
        "weights:checkpoint-truncated",
        RESUME,
        2,
        says=("step-00000002/optimizer.safetensors", "tensor '1.exp_avg'", "latest.json"),
        setup=_cut_inside("qs/train/checkpoints/step-00000002/optimizer.safetensors", "1.exp_avg"),
    ),
    Case(
        "weights:shard-truncated",
        EVAL,
        2,
        says=(
            "{ws}/qs/data/eval_shards/shard_00000.safetensors",
            "tensor 'aux'",
            "cut short",
            "rerun the capture",
        ),
        setup=_cut_inside("qs/data/eval_shards/shard_00000.safetensors", "aux"),
    ),
]
