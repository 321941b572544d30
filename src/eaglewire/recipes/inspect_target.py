"""Stage 1 of the quickstart: load the target, build its contract, show ids and per-boundary norms."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.contract.contract import Contract
from eaglewire.contract.fingerprint import StateKey
from eaglewire.contract.numbering import describe_boundary, engine_ids_table
from eaglewire.target.capture import capture_all
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget

NORM_PROBE = [{"role": "user", "content": "Write a haiku about speculative decoding."}]


@dataclass
class BoundaryNorm:
    key: StateKey
    meaning: str
    mean_token_norm: float
    is_aux: bool
    is_final: bool


def boundary_norms(target: LoadedTarget, contract: Contract) -> list[BoundaryNorm]:
    """Mean per-token L2 norm at every boundary on a chat-formatted probe prompt."""
    tok = target.tokenizer
    text = tok.apply_chat_template(NORM_PROBE, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=target.device)
    states = capture_all(target.model, ids)
    L = target.num_layers
    final_key = StateKey(contract.final.boundary, contract.final.norm)
    rows = []
    for key, x in states.items():
        meaning = (
            "final norm output (HF hidden_states[L])"
            if key.norm == "post"
            else describe_boundary(key.boundary, L)
        )
        rows.append(
            BoundaryNorm(
                key=key,
                meaning=meaning,
                mean_token_norm=float(x[0].float().norm(dim=-1).mean()),
                is_aux=key.norm == "pre" and key.boundary in contract.aux_boundaries,
                is_final=key == final_key,
            )
        )
    return rows


@dataclass
class TargetReport:
    contract: Contract
    engine_ids: dict[str, tuple[int, ...] | str]
    norms: list[BoundaryNorm]


def inspect_target(target: LoadedTarget) -> TargetReport:
    contract = build_contract(target)
    return TargetReport(
        contract=contract,
        engine_ids=engine_ids_table(contract.aux_boundaries, target.num_layers, target.architecture),
        norms=boundary_norms(target, contract),
    )
