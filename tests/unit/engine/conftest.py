"""Shared fixtures for the engine tests: a tiny target, an untrained and a trained-like draft,
and plain greedy references computed straight from the Hugging Face model (an oracle that
shares no code with the engine)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from eaglewire.contract.contract import Contract
from eaglewire.draft.init import init_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.decode_trace import DecodeTrace
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import CORPUS, make_tiny_target

NUM_LAYERS = 4
AUX_BOUNDARIES = (1, 2, 3)
REFERENCE_TOKENS = 40
TRAIN_STEPS = 40

RUNNER_KINDS = ["hf", "fast"]


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """Tiny models run ~20x faster on one thread than with two threads fighting over two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def inside_blocks(trace: DecodeTrace) -> list[int]:
    """Indices of generated tokens that are not the last of their round (a stop there is mid-round)."""
    inside, start = [], 0
    for emitted in trace.emitted_per_round:
        inside += list(range(start, start + emitted - 1))
        start += emitted
    return inside


@torch.no_grad()
def plain_greedy(model: torch.nn.Module, prompt_ids: list[int], n: int) -> list[int]:
    """n greedy tokens by full recomputation with the HF model itself."""
    ids = list(prompt_ids)
    out = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    return out


@dataclass
class Tiny:
    target: LoadedTarget
    contract: Contract
    untrained: Eagle3Draft
    prompts: list[list[int]]  # chat-templated prompt ids (plus one single-token prompt)
    references: list[list[int]]  # REFERENCE_TOKENS greedy tokens after each prompt


def chat_ids(target: LoadedTarget, text: str) -> list[int]:
    tok = target.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="package")
def tiny() -> Tiny:
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    contract = build_contract(target, AUX_BOUNDARIES)
    prompts = [chat_ids(target, text) for text in CORPUS[:3]] + [[17]]
    references = [plain_greedy(target.model, p, REFERENCE_TOKENS) for p in prompts]
    return Tiny(target, contract, init_draft(target, contract).eval(), prompts, references)


def train_draft(tiny: Tiny, steps: int = TRAIN_STEPS, num_attention_heads: int | None = None) -> Eagle3Draft:
    """A draft that agrees with the target often: next-token cross-entropy on the target's own
    greedy text (rows (aux_t, x_t+1) -> target argmax at t+1), plus a second unrolled step that
    feeds the draft's hidden back (so depth >= 2 also gets accepted). num_attention_heads: the draft
    layer's query heads (None: the target's)."""
    draft = init_draft(tiny.target, tiny.contract, num_attention_heads=num_attention_heads, seed=1)
    rows = []
    for prompt, ref in zip(tiny.prompts[:3], tiny.references[:3], strict=True):
        seq = torch.tensor([prompt + ref])
        states = capture(
            tiny.target.model,
            seq,
            aux_boundaries=tiny.contract.aux_boundaries,
            final=tiny.contract.final,
            return_logits=True,
        )
        assert states.logits is not None
        labels = states.logits[0].argmax(-1)
        rows.append((states.aux[:, :-1], seq[:, 1:], labels[1:]))
    params = [p for name, p in draft.named_parameters() if name != "embed_tokens.weight"]
    opt = torch.optim.Adam(params, lr=3e-3)
    draft.train()
    for _ in range(steps):
        loss = torch.zeros(())
        for aux, tokens, labels in rows:
            T = tokens.shape[1]
            positions = torch.arange(T)[None]
            hidden = draft.project(aux)
            first = draft(tokens, hidden, positions)
            loss = loss + F.cross_entropy(first.logits[0], labels)
            fed_back = torch.cat([hidden[:, :1], first.hidden[:, :-1]], dim=1)  # row t gets row t-1's output
            second = draft(tokens, fed_back, positions)
            loss = loss + F.cross_entropy(second.logits[0, 1:], labels[1:])
        opt.zero_grad()
        (loss / len(rows)).backward()
        opt.step()
    return draft.eval().requires_grad_(False)


@pytest.fixture(scope="package")
def trained(tiny: Tiny) -> Eagle3Draft:
    return train_draft(tiny)
