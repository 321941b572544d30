"""Exact offline tau of a *dynamic* tree on text a target already generated greedily.

Greedy verification accepts a drafted node exactly when its token is the target's greedy next
token after its path, so on a text the target generated greedily (`bench.json`'s plain runs) the
whole verification is known in advance: a node is accepted iff it and its ancestors spell the
text. `TextRunner` is a `TargetRunner` that answers from that text (logits one-hot on the text's
next token along it) and from the target's aux states over the text, captured once teacher-forced,
so the engine's own `SpeculativeDecoder` and `Drafter` run their real dynamic trees (reranked by
the draft's scores every round) with no target forward per round. Off-text nodes are never
accepted, so their logits and aux are never read: they are zeros.

The static tree of `predictor.tree_for_spec` was 5-7% below the H200's measured trees on MT-bench;
this replays every round the engine runs and came within 1-2% (log §2p). In float32 a CPU
test finds the engine's own rounds exactly (`tests/unit/predict/test_text_replay.py`). What remains
is numerics (the aux here come from one teacher-forced forward, the engine's from its verification
forwards, bf16 on a GPU) and the last round of a text that ends where decoding stopped.
`predict.served` predicts every tree setting's tau with it on the served text, `predict.heldout_trees`
on the held-out answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eaglewire.contract.contract import Contract
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.runners.protocol import TargetForward
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget


class TextRunner:
    """A batch-1 `TargetRunner` over a known greedy text (`set_text`: ids [T], aux [T, A*Ht]); one
    runner serves many texts, so one decoder (and its drafter's captured graphs) replays them all."""

    def __init__(
        self, *, vocab_size: int, num_layers: int, device: torch.device, dtype: torch.dtype, max_seq_len: int
    ) -> None:
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.device = device
        self.dtype = dtype
        self.max_seq_len = max_seq_len  # what the drafter sizes its cache by: the longest text and a tree
        self.text = torch.zeros(0, dtype=torch.long, device=device)  # [T]
        self.aux = torch.zeros(0, 0, dtype=dtype, device=device)  # [T, A*Ht]
        self._length = 0

    def set_text(self, text_ids: torch.Tensor, aux: torch.Tensor) -> None:
        """The text the next generation follows, and the target's aux states over it."""
        if aux.shape[0] != text_ids.shape[0]:
            raise ValueError(
                expected_actual("aux rows (one per text token)", text_ids.shape[0], aux.shape[0])
            )
        if text_ids.shape[0] > self.max_seq_len:
            raise ConfigError(
                expected_actual("text tokens at most max_seq_len", self.max_seq_len, text_ids.shape[0])
            )
        self.text = text_ids.long().to(self.device)
        self.aux = aux.to(self.device, self.dtype)

    def reset(self, batch_size: int) -> None:
        if batch_size != 1:
            raise ConfigError(f"TextRunner replays one text: batch_size {batch_size}")
        self._length = 0

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([self._length])

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None
    ) -> TargetForward:
        """input_ids, positions [1, N]; tree_mask [1, N, N] (ancestors and self) or None (causal)."""
        ids, pos = input_ids[0].to(self.device), positions[0].to(self.device)  # [N]
        N, T = ids.shape[0], self.text.shape[0]
        inside = pos < T
        spelled = inside & (ids == self.text[pos.clamp(max=T - 1)])  # [N] this node's token is the text's
        causal = torch.ones(N, N, dtype=torch.bool, device=self.device).tril()
        sees = causal if tree_mask is None else tree_mask[0].to(self.device)  # [N, N] ancestors and self
        on_text = ~(sees & ~spelled[None, :]).any(dim=1)  # [N] it and every ancestor spell the text
        logits = torch.zeros(N, self.vocab_size, device=self.device)  # [N, V]
        speaks = on_text & (pos + 1 < T)  # nodes whose next text token exists
        logits[speaks.nonzero()[:, 0], self.text[pos[speaks] + 1]] = 1.0
        aux = torch.zeros(N, self.aux.shape[1], dtype=self.dtype, device=self.device)  # [N, A*Ht]
        aux[on_text] = self.aux[pos[on_text]]
        return TargetForward(logits[None], aux[None])

    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        self._length += int(num_accepted[0])


@dataclass(frozen=True)
class TextReplay:
    """Rounds a setting runs over texts: `tau` = tokens emitted per verification."""

    rounds: int
    tokens: int
    accepted_per_round: tuple[int, ...]

    @property
    def tau(self) -> float:
        return self.tokens / max(self.rounds, 1)

    def per_position_acceptance(self, depth: int) -> list[float]:
        rounds = max(self.rounds, 1)
        return [sum(a >= k for a in self.accepted_per_round) / rounds for k in range(1, depth + 1)]


def text_aux(target: LoadedTarget, contract: Contract, text_ids: Sequence[int]) -> torch.Tensor:
    """The target's aux states over a text, teacher-forced in one forward: [T, A*Ht]."""
    ids = torch.tensor([list(text_ids)], dtype=torch.long, device=target.device)  # [1, T]
    with torch.no_grad():
        states = capture(target.model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final)
    return states.aux[0]


def replay_on_texts(
    draft: Eagle3Draft,
    spec: SpecArgs,
    texts: Sequence[tuple[Sequence[int], Sequence[int]]],
    auxes: Sequence[torch.Tensor],
    *,
    vocab_size: int,
    num_layers: int,
    max_new_tokens: int | None = None,
) -> TextReplay:
    """Decode each (prompt ids, generated ids) with `spec` over a `TextRunner` (aux from `text_aux`
    over prompt + generated), `max_new_tokens` tokens (None: all generated); the decoder must
    reproduce the generated ids, and its rounds are pooled. The last round of a text decoded to its
    very end accepts no draft past it (the text has none), where the engine's may; a text that
    runs past `max_new_tokens` replays that round exactly too."""
    from eaglewire.engine.api import SpeculativeDecoder

    if not texts:
        raise ConfigError("replay_on_texts: no texts")
    longest = max(len(p) + len(g) for p, g in texts)
    runner = TextRunner(vocab_size=vocab_size, num_layers=num_layers, device=auxes[0].device, dtype=auxes[0].dtype,
                        max_seq_len=longest + spec.num_draft_tokens + 1)  # fmt: skip
    decoder = SpeculativeDecoder(runner, draft, spec)
    rounds = tokens = 0
    accepted: list[int] = []
    for (prompt, generated), aux in zip(texts, auxes, strict=True):
        runner.set_text(torch.tensor([*prompt, *generated], dtype=torch.long), aux)
        n = len(generated) if max_new_tokens is None else min(max_new_tokens, len(generated))
        result = decoder.generate(list(prompt), max_new_tokens=n)
        if result.token_ids != list(generated[:n]):
            raise ConfigError(
                "the replayed text left the generated text: the text was not greedy, or its ids moved"
            )
        rounds += result.num_verifications
        tokens += sum(result.emitted_per_round)  # as the bench's tau counts (the last round uncut)
        accepted += list(result.accepted_per_round)
    return TextReplay(rounds, tokens, tuple(accepted))
