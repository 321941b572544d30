"""Nothing pre-existing is damaged: every command that writes a directory writes only a new or empty
one, or an earlier output of its own kind (its `eaglewire.json` marker), replaced whole with
`--force`; resumable runs keep their resume rules, a run from before markers included.

The harness checks that a refusal changes and adds no file (the target, the trained draft, the
other export stay byte-identical); `then` checks what a replacement must have removed."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.faults.harness import Case

DRAFT = "{ws}/qs/train/draft"
EXPORT = f"export --draft {DRAFT}"
BUILD = "data build --target {ws}/target --input {ws}/qs/data/train.jsonl --no-progress"


def _stale_file_in_sglang_export(ws: Path) -> None:
    (ws / "qs/export/sglang/launch_vllm.sh").write_text("#!/usr/bin/env bash\n# stale\n")


def _no_stale_export_file(ws: Path) -> None:
    names = sorted(p.name for p in (ws / "qs/export/sglang").iterdir())
    assert "launch_vllm.sh" not in names and "launch_sglang.sh" in names, names
    assert not [
        p.name for p in (ws / "qs/export").iterdir() if p.name.startswith(".")
    ]  # no temporary dir left


def _vocab_beside_dataset(ws: Path) -> None:
    from eaglewire.data.vocab import VOCAB_FILES
    from eaglewire.output_marker import OutputKind, update_marker

    for name in VOCAB_FILES:
        shutil.copy(ws / "qs/data/vocab" / name, ws / "qs/data/train" / name)
    update_marker(ws / "qs/data/train", OutputKind.DATASET, VOCAB_FILES)


def _no_stale_vocab(ws: Path) -> None:
    from eaglewire.output_marker import read_marker, verify_files

    names = sorted(p.name for p in (ws / "qs/data/train").iterdir())
    assert not [n for n in names if n.startswith("draft_vocab")], names
    marker = read_marker(ws / "qs/data/train")
    assert marker is not None and sorted(marker.files) == ["index.json", "tokens.safetensors"]
    verify_files(ws / "qs/data/train")


def _run_from_before_markers(ws: Path) -> None:
    (ws / "qs/train/eaglewire.json").unlink()
    (ws / "qs/train/draft/eaglewire.json").unlink()


def _run_marked_now(ws: Path) -> None:
    from eaglewire.output_marker import OutputKind, read_marker

    run, draft = read_marker(ws / "qs/train"), read_marker(ws / "qs/train/draft")
    assert run is not None and run.kind is OutputKind.TRAIN_RUN
    assert draft is not None and draft.kind is OutputKind.DRAFT and "model.safetensors" in draft.files


CASES = [
    Case(
        "outputs:export-into-the-target",
        f"{EXPORT} --format sglang --out {{ws}}/target --force",
        2,
        says=(
            "--out {ws}/target",
            "not an eaglewire output",
            "model.safetensors",
            "fix: choose another --out",
        ),
    ),
    Case(
        "outputs:draft-init-over-the-trained-draft",
        f"draft init --target {{ws}}/target --out {DRAFT}",
        2,
        says=(f"--out {DRAFT}", "holds an earlier eaglewire draft", "--force"),
    ),
    Case(
        "outputs:import-over-a-draft",
        f"import --format sglang --src {{ws}}/qs/export/sglang --target {{ws}}/target --out {DRAFT}",
        2,
        says=(f"--out {DRAFT}", "holds an earlier eaglewire draft", "--force"),
    ),
    Case(
        "outputs:sglang-export-into-the-vllm-export",
        f"{EXPORT} --format sglang --out {{ws}}/qs/export/vllm",
        2,
        says=("--out {ws}/qs/export/vllm", "holds a vLLM export, not an SGLang export"),
    ),
    Case(
        "outputs:force-over-another-kind",
        "draft init --target {ws}/target --out {ws}/qs/export/sglang --force",
        2,
        says=("holds an SGLang export, not an eaglewire draft", "--force or not"),
    ),
    Case(
        "outputs:export-force-replaces-its-own-export-whole",
        f"{EXPORT} --format sglang --out {{ws}}/qs/export/sglang --force",
        0,
        setup=_stale_file_in_sglang_export,
        changes=("qs/export/sglang",),
        then=_no_stale_export_file,
    ),
    Case(
        "outputs:data-build-over-a-dataset",
        f"{BUILD} --out {{ws}}/qs/data/train",
        2,
        says=("--out {ws}/qs/data/train", "holds an earlier tokenized dataset", "--force"),
    ),
    Case(
        "outputs:data-build-force-leaves-no-stale-vocab",
        f"{BUILD} --out {{ws}}/qs/data/train --force",
        0,
        setup=_vocab_beside_dataset,
        changes=("qs/data/train",),
        then=_no_stale_vocab,
    ),
    Case(
        "outputs:train-into-a-model-directory",
        "train --target {ws}/target --data {ws}/qs/data/train_shards --out {ws}/target5",
        2,
        says=("--out {ws}/target5", "not an eaglewire output", "config.json"),
    ),
    Case(
        "outputs:regenerate-into-a-file-it-did-not-write",
        "data regenerate --target {ws}/target --input {ws}/qs/data/train.jsonl --out {ws}/prompts.txt",
        2,
        says=(
            "--out {ws}/prompts.txt",
            "not an earlier output of eaglewire data regenerate",
            "prompts.txt.regen.json",
        ),
    ),
    Case(
        "outputs:a-run-from-before-markers-resumes",
        "train --target {ws}/target --data {ws}/qs/data/train_shards --out {ws}/qs/train --resume --no-progress",
        0,
        setup=_run_from_before_markers,
        changes=("qs/train",),
        then=_run_marked_now,
    ),
]
