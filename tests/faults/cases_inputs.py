"""Inputs that cannot hurt (issue 43 items 6 and 7): plain decoding needs no aux boundaries; a
contract whose aux list contradicts its own fingerprint labels is refused; nonsense flag values are
refused before any work (no model loaded: those cases take a fraction of a second), naming the flag
as typed and the values it allows; malformed conversation files are named by file and line (a BOM
opening the file is accepted); an empty input is an error unless --allow-empty says otherwise; `eval`
with a target of another tokenizer names the draft's and the live target's sides as what they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.faults.harness import Case

TARGET = "--target {ws}/target"
DRAFT = "{ws}/qs/train/draft"
EVAL = f"eval {TARGET} --draft {DRAFT} --data {{ws}}/qs/data/eval --device cpu"
GENERATE = f"generate {TARGET} --prompt hi --device cpu"
BUILD = f"data build {TARGET} --out {{ws}}/built --no-progress"
REGENERATE = f"data regenerate {TARGET} --out {{ws}}/regen.jsonl --device cpu --no-progress"

CONVERSATION = {"messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."}]}
NULL_USER = {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "Hi."}]}
BOM = b"\xef\xbb\xbf"


def _jsonl(name: str, *lines: bytes) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        (ws / name).write_bytes(b"".join(lines))

    return setup


def _row(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _relabel_contract(ws: Path) -> None:
    """Edit the draft's contract.json by hand: its aux list no longer says what its fingerprint's
    labels (written at capture) say."""
    path = ws / "qs/train/draft/contract.json"
    contract = json.loads(path.read_text(encoding="utf-8"))
    assert contract["aux_boundaries"] == [2, 4, 5]  # the tiny quickstart's wiring
    contract["aux_boundaries"] = [3, 4, 5]
    path.write_text(json.dumps(contract, indent=2), encoding="utf-8")


def _target_with_other_tokenizer(ws: Path) -> None:
    """A copy of the target whose tokenizer numbers two tokens the other way round (same weights)."""
    import shutil

    shutil.copytree(ws / "target", ws / "target_tok")
    path = ws / "target_tok/tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    vocab["He"], vocab["How"] = vocab["How"], vocab["He"]
    path.write_text(json.dumps(tok), encoding="utf-8")


CASES = [
    # --- plain decoding reads no aux states: a 5-layer target has no default boundaries, and needs none
    Case(
        "inputs:generate-plain-on-a-shallow-target",
        "generate --target {ws}/target5 --prompt hi --max-new-tokens 4 --device cpu",
        0,
        says=("plain decoding (no draft)", "max_new_tokens"),
    ),
    # --- a contract must agree with its own fingerprint labels
    Case(
        "inputs:contract-aux-list-contradicts-its-fingerprint",
        f"{GENERATE} --draft {DRAFT} --max-new-tokens 4",
        2,
        says=(
            "{ws}/qs/train/draft/contract.json",
            "aux_boundaries [3, 4, 5]",
            "labelled [2, 4, 5]",
            "fix: if aux_boundaries",
        ),
        setup=_relabel_contract,
    ),
    # --- nonsense flag values, refused before any work, naming the flag as typed and its range
    Case(
        "inputs:generate-max-new-tokens-0",
        f"{GENERATE} --max-new-tokens 0",
        2,
        says=("--max-new-tokens: expected >= 1", "got 0"),
    ),
    Case(
        "inputs:generate-max-new-tokens-negative",
        f"{GENERATE} --max-new-tokens -5",
        2,
        says=("--max-new-tokens: expected >= 1", "got -5"),
    ),
    Case(
        "inputs:generate-spec-flags-as-typed",
        f"{GENERATE} --num-steps 1 --topk 1 --num-draft-tokens 16",
        2,
        says=("--num-draft-tokens=16 with --num-steps=1, --topk=1", "pass --num-draft-tokens=2"),
    ),
    Case(
        "inputs:eval-num-steps-0",
        f"{EVAL} --num-steps 0",
        2,
        says=("--num-steps: expected 1 <= --num-steps <= 32",),
    ),
    Case(
        "inputs:eval-num-steps-500",
        f"{EVAL} --num-steps 500",
        2,
        says=("--num-steps: expected 1 <= --num-steps <= 32", "got 500"),
    ),
    Case("inputs:eval-batch-size-0", f"{EVAL} --batch-size 0", 2, says=("--batch-size: expected >= 1",)),
    Case(
        "inputs:eval-max-length-0",
        f"{EVAL} --max-length 0",
        2,
        says=("--max-length: expected >= 7 tokens per row", "got 0"),
    ),
    Case(
        "inputs:train-precision-fp8",
        f"train {TARGET} --data {{ws}}/qs/data/train --out {{ws}}/run --precision fp8",
        2,
        says=("--precision: expected one of auto, bf16, fp32", "'fp8'"),
    ),
    # the draft MLP width: one option, one check, for `draft init` and `train`
    Case(
        "inputs:draft-init-mlp-width-0",
        f"draft init {TARGET} --out {{ws}}/d0 --draft-intermediate-size 0",
        2,
        says=("--draft-intermediate-size: expected >= 1 (the draft layer's MLP width)", "got 0"),
    ),
    Case(
        "inputs:draft-init-mlp-width-48",
        f"draft init {TARGET} --out {{ws}}/d48 --draft-intermediate-size 48",
        0,
        says=("48",),
    ),
    Case(
        "inputs:train-mlp-width-negative",
        f"train {TARGET} --data {{ws}}/qs/data/train --out {{ws}}/run --draft-intermediate-size -3",
        2,
        says=("--draft-intermediate-size: expected >= 1 (the draft layer's MLP width)", "got -3"),
    ),
    Case(
        "inputs:data-build-limit-0",
        f"{BUILD} --input {{ws}}/qs/data/train.jsonl --limit 0",
        2,
        says=("--limit: expected >= 1", "got 0"),
    ),
    Case(
        "inputs:data-build-limit-negative",
        f"{BUILD} --input {{ws}}/qs/data/train.jsonl --limit -2",
        2,
        says=("--limit: expected >= 1", "got -2"),
    ),
    # --- a benchmark prompt set is never training data: by name, or as answers made for its prompts
    Case(
        "inputs:data-build-benchmark-set-by-name",
        f"{BUILD} --input user-eval",
        2,
        says=("'user-eval' is a benchmark prompt set", "evaluation only", "builtin:chitchat"),
    ),
    Case(
        "inputs:data-build-benchmark-ids",
        f"{BUILD} --input {{ws}}/answered.jsonl",
        2,
        says=("held-out evaluation split", "'user-eval:math-01'", "--split eval"),
        setup=_jsonl("answered.jsonl", _row({**CONVERSATION, "id": "user-eval:math-01"})),
    ),
    # --- conversation files
    Case(
        "inputs:null-user-content",
        f"{BUILD} --input {{ws}}/null.jsonl",
        2,
        says=("{ws}/null.jsonl:2: messages[0] (user).content", "no content", "--skip-bad"),
        setup=_jsonl("null.jsonl", _row(CONVERSATION), _row(NULL_USER)),
    ),
    Case(
        "inputs:bom-opening-the-file-is-accepted",
        f"{BUILD} --input {{ws}}/bom.jsonl",
        0,
        says=("dataset written to",),
        setup=_jsonl("bom.jsonl", BOM, _row(CONVERSATION)),
    ),
    Case(
        "inputs:bom-inside-the-file",
        f"{BUILD} --input {{ws}}/bom.jsonl",
        2,
        says=("{ws}/bom.jsonl:2", "UTF-8 byte-order mark (bytes EF BB BF)", "remove the 3 bytes"),
        setup=_jsonl("bom.jsonl", _row(CONVERSATION), BOM, _row(CONVERSATION)),
    ),
    Case(
        "inputs:regenerate-empty-input",
        f"{REGENERATE} --input {{ws}}/empty.jsonl",
        2,
        says=("--input {ws}/empty.jsonl: no conversation to regenerate", "--allow-empty"),
        setup=_jsonl("empty.jsonl"),
    ),
    Case(
        "inputs:regenerate-empty-input-allowed",
        f"{REGENERATE} --input {{ws}}/empty.jsonl --allow-empty",
        0,
        says=("regenerated into",),
        setup=_jsonl("empty.jsonl"),
    ),
    # --- eval on a target with another tokenizer: which side is which, and the fix that helps
    Case(
        "inputs:eval-target-with-another-tokenizer",
        f"eval --target {{ws}}/target_tok --draft {DRAFT} --data {{ws}}/qs/data/eval --device cpu --num-steps 2",
        2,
        says=(
            "--target {ws}/target_tok: not the target the draft was trained for",
            "target.tokenizer_hash: draft contract=",
            " --target=",
            "fix: pass the draft's own target, --target ",  # the path the draft was trained with
            "/target (its contract.json's target.name)",
        ),
        setup=_target_with_other_tokenizer,
    ),
]
