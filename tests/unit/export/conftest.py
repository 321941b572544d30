"""Fixtures for export/import tests: tiny random targets and trained-looking drafts saved to disk."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target, save_tiny_target

DRAFT_VOCAB = 200  # Vd < V (the tiny tokenizer has V = 384)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls are fastest single-threaded (10x faster on a busy 2-core machine); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> LoadedTarget:
    """The 8-layer tiny llama, saved: contracts name a real directory, which exports write as an absolute path."""
    t = make_tiny_target("llama", num_layers=8)
    directory = save_tiny_target(t, tmp_path_factory.mktemp("tiny-target"))
    return replace(t, path=directory)


def randomize(draft: Eagle3Draft, seed: int) -> Eagle3Draft:
    """Every weight random (norms too), so a swapped or dropped tensor changes the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return draft


def vocab_subset(vocab_size: int, size: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(vocab_size, generator=gen)[:size].sort().values


MakeDraft = Callable[..., Path]


@pytest.fixture
def make_draft(tmp_path: Path, tiny_target: LoadedTarget) -> MakeDraft:
    """Save a random draft for `target` (default: the 8-layer tiny llama) and return its directory."""

    def make(
        *,
        target: LoadedTarget | None = None,
        boundaries: Sequence[int] | None = None,
        draft_vocab: int | None = DRAFT_VOCAB,
        name: str = "draft",
        seed: int = 1,
    ) -> Path:
        t = target or tiny_target
        contract = build_contract(t, boundaries)
        d2t = None if draft_vocab is None else vocab_subset(t.vocab_size, draft_vocab, seed)
        draft = randomize(init_draft(t, contract, draft_to_target=d2t, seed=seed), seed)
        return save_draft(draft, contract, tmp_path / name)

    return make


def draft_logits(
    draft: Eagle3Draft, *, seed: int = 7, batch: int = 2, tokens: int = 6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two unrolled draft steps on random inputs: (logits step 1, logits step 2), each [B, T, Vd]."""
    from eaglewire.draft.model import GrowingKV

    gen = torch.Generator().manual_seed(seed)
    cfg = draft.config
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=gen)
    aux = torch.randn(batch, tokens, cfg.aux_width, generator=gen)  # [B, T, A*Ht]
    positions = torch.arange(tokens).expand(batch, tokens)
    kv = GrowingKV()
    with torch.no_grad():
        first = draft(ids, draft.project(aux), positions, kv=kv)
        second = draft(ids, first.hidden, positions + 1, kv=kv)
    return first.logits, second.logits
