"""A tiny, real pipeline for the doctor's tests: tiny target, records captured with the real
capture function (at whatever boundaries a test wants, labelled however it wants), a draft
trained for a few seconds at step 0 on them, and engine-style draft configs.

Nothing is mocked: faults are injected exactly where they happen in the field (the capture
boundaries, the labels, the stored dtype, the config's ids).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from eaglewire.contract.contract import Contract, FinalState
from eaglewire.data.types import CapturedRecord
from eaglewire.draft.init import init_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from eaglewire.train.ttt import ttt_unroll
from tests.helpers.tiny import make_tiny_target

PROMPT_TOKENS = 6  # leading tokens of each record outside the loss mask (the "user turn")


@functools.lru_cache(maxsize=4)
def tiny(num_layers: int = 12, dtype: str = "float32") -> LoadedTarget:
    return make_tiny_target("llama", num_layers=num_layers, dtype=getattr(torch, dtype))


def make_records(
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    final: FinalState | None = None,
    *,
    n: int = 6,
    length: int = 40,
    seed: int = 0,
    store_dtype: torch.dtype | None = None,
) -> list[CapturedRecord]:
    """Records of random tokens whose states are captured by the real capture at `aux_boundaries`."""
    final = final or FinalState(target.num_layers, "pre")
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, target.vocab_size, (length,), generator=g)
        states = capture(target.model, ids[None], aux_boundaries=list(aux_boundaries), final=final)
        mask = torch.ones(length, dtype=torch.bool)
        mask[:PROMPT_TOKENS] = False
        aux, fin = states.aux[0], states.final[0]
        if store_dtype is not None:
            aux, fin = aux.to(store_dtype), fin.to(store_dtype)
        out.append(CapturedRecord(f"rec:{i}", ids, mask, aux, fin))
    return out


def labelled(
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    final: FinalState | None = None,
    *,
    fingerprint: bool = False,
    dtype: str | None = None,
) -> Contract:
    """A contract that *declares* these boundaries (what a label says, whatever the data is)."""
    c = build_contract(target, aux_boundaries, fingerprint=fingerprint)
    if final is not None:
        c = replace(c, final=final)
    if dtype is not None:
        c = replace(c, dtype=dtype)
    return c


def oracle_records(
    target: LoadedTarget,
    draft: Eagle3Draft,
    aux_boundaries: Sequence[int],
    *,
    n: int = 4,
    length: int = 32,
    seed: int = 0,
) -> list[CapturedRecord]:
    """Records the draft predicts perfectly at step 0 when fed `aux_boundaries` (and only then, up to chance).

    Stands in for "a draft trained to convergence on its data", in milliseconds: each training
    token x[t+2] is the draft's own step-0 prediction from the real captured aux states h_t and
    x[t+1] (training's alignment). Prompt tokens are random. States are captured by the real
    capture; the draft is a real (randomly initialised) Eagle3Draft.
    """
    final = FinalState(target.num_layers, "pre")
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, target.vocab_size, (length,), generator=g)
        for t in range(PROMPT_TOKENS - 2, length - 2):  # fix x[t+2] from rows 0..t
            states = capture(
                target.model, ids[None, : t + 2], aux_boundaries=list(aux_boundaries), final=final
            )
            pred = step0_predictions(draft, ids[: t + 2], states.aux[0])
            ids[t + 2] = pred[t]
        states = capture(target.model, ids[None], aux_boundaries=list(aux_boundaries), final=final)
        mask = torch.ones(length, dtype=torch.bool)
        mask[:PROMPT_TOKENS] = False
        out.append(CapturedRecord(f"oracle:{i}", ids, mask, states.aux[0], states.final[0]))
    return out


def recaptured(
    target: LoadedTarget, records: Sequence[CapturedRecord], aux_boundaries: Sequence[int]
) -> list[CapturedRecord]:
    """The same tokens and masks, with the aux states captured (for real) at other boundaries."""
    out = []
    for r in records:
        states = capture(
            target.model,
            r.input_ids[None],
            aux_boundaries=list(aux_boundaries),
            final=FinalState(target.num_layers, "pre"),
        )
        out.append(replace(r, aux=states.aux[0], final=states.final[0]))
    return out


@dataclass(frozen=True)
class MislabelledWorld:
    """Data whose labels say `labels` but whose columns are boundaries `stored`, and a draft whose
    contract says `labels` (built on the live target, so its fingerprint matches it) that learned `learned`."""

    draft: Eagle3Draft
    draft_contract: Contract
    records: list[CapturedRecord]
    data_contract: Contract


def mislabelled_world(
    target: LoadedTarget,
    *,
    labels: Sequence[int],
    stored: Sequence[int],
    learned: Sequence[int],
    n: int = 4,
    length: int = 32,
    seed: int = 0,
) -> MislabelledWorld:
    """`learned == labels`: "this data is mislabelled" (the draft was trained on correctly labelled data);
    `learned == stored`: "this draft was trained on mislabelled data" (it learned the columns' real boundaries).

    The draft stands in for one trained to convergence (see `oracle_records`): the data's tokens are its own
    step-0 predictions from the states at `learned`; the stored columns are then captured at `stored`.
    """
    contract = build_contract(target, labels)
    draft = init_draft(target, contract, seed=seed).eval()
    records = oracle_records(target, draft, learned, n=n, length=length, seed=seed)
    if tuple(stored) != tuple(learned):
        records = recaptured(target, records, stored)
    return MislabelledWorld(draft, contract, records, build_contract(target, labels))


@torch.no_grad()
def step0_predictions(draft: Eagle3Draft, ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    """[T] target ids the draft predicts at step 0 for rows 0..T-1 (row t: x[t+2])."""
    T = ids.shape[0]
    doc = torch.zeros(1, T, dtype=torch.long)
    out = next(iter(ttt_unroll(draft, ids[None], torch.arange(T)[None], doc, aux[None].float(), 1)))
    return draft.to_target_ids(out.logits.argmax(-1))[0]


def write_sglang_config(
    directory: Path, ids: Sequence[int] | None, *, target: LoadedTarget, num_aux: int = 3
) -> Path:
    """An SGLang-style draft config.json (LlamaForCausalLMEagle3, nested eagle_config), as SGLang reads it."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": target.hidden_size,
        "num_hidden_layers": 1,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": target.vocab_size,
        "target_hidden_size": target.hidden_size,
        "eagle_config": {"use_aux_hidden_state": True},
    }
    if ids is not None:
        cfg["eagle_config"] = {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": list(ids)}
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def write_speculators_config(directory: Path, ids: Sequence[int] | None, *, target: LoadedTarget) -> Path:
    """A vLLM/speculators-style draft config.json (top-level ids in boundary numbering)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, object] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"vocab_size": target.vocab_size, "hidden_size": target.hidden_size},
        "draft_vocab_size": target.vocab_size,
        "target_hidden_size": target.hidden_size,
    }
    if ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(ids)
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


@functools.lru_cache(maxsize=2)
def tiny_hidden(num_layers: int, hidden: int) -> LoadedTarget:
    """A tiny Llama with a chosen hidden size (e.g. the field reports' 61 layers at hidden 32)."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.tiny import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = tiny_config("llama", vocab_size=len(tok), num_layers=num_layers)
    cfg.hidden_size, cfg.intermediate_size = hidden, 2 * hidden
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    return LoadedTarget(model=model, tokenizer=tok, path=Path(f"<tiny-llama-L{num_layers}-H{hidden}>"))


def rewrite_marker(directory: Path) -> None:
    """Record the files' new checksums in the directory's marker, as eaglewire does when it writes them
    (a draft whose weights a test changed the way training or another tool would, not a damaged copy)."""
    from eaglewire.output_marker import read_marker, write_marker

    marker = read_marker(directory)
    if marker is not None:
        write_marker(directory, marker.kind, marker.files)
