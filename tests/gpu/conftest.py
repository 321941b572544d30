"""What the CUDA-only tests share: a tiny Llama target with a draft trained on its greedy text."""

from __future__ import annotations

import torch

from eaglewire.draft.init import init_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import CORPUS, make_tiny_target
from tests.unit.engine.conftest import AUX_BOUNDARIES, NUM_LAYERS, Tiny, chat_ids, plain_greedy, train_draft

# the settings and greedy length the CUDA speculative tests run
SPECS = {"chain": SpecArgs.chain(4), "tree": SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)}
TOKENS = 40


def tiny_on_cuda(tokens: int, extra_prompts: list[list[int]] | None = None) -> tuple[Tiny, torch.nn.Module]:
    """(the tiny target moved to CUDA with its prompts and `tokens`-token plain greedy references,
    a trained draft on CUDA); trained on CPU first, as the CPU tests train it."""
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    contract = build_contract(target, AUX_BOUNDARIES)
    prompts = [chat_ids(target, text) for text in CORPUS[:3]] + (extra_prompts or [])
    references = [plain_greedy(target.model, p, tokens) for p in prompts]
    tiny = Tiny(target, contract, init_draft(target, contract).eval(), prompts, references)
    trained = train_draft(tiny).eval()
    target.model.to("cuda")
    return tiny, trained.to("cuda")
