"""Verification of a draft tree against the target's logits, and when generation stops.

Greedy: walk from the root; at each node the target's argmax must equal one of its children's
tokens to go on. The emitted tokens are the accepted drafts plus the *bonus*: the target's
choice at the last accepted node. So every verification emits at least one token.

Sampling (lossless with respect to the processed target distribution `target_probs`):
  - a node whose children are deterministic candidates (trees; EAGLE-2/SGLang style) runs
    recursive rejection with point-mass drafts: try the children in rank order, accept child x
    with probability residual(x); on rejection set residual(x) = 0 and renormalise; if every
    child is rejected, the bonus is drawn from the residual. P(emit y) = target_probs(y) exactly.
  - a node whose child was *sampled* from a draft distribution q (sampled chains): accept with
    probability min(1, p(x) / q(x)); on rejection draw from normalise(max(p - q, 0)).
The bonus at the last accepted node is drawn from its (full) target distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eaglewire.engine.sampling import SamplingParams, probs_from_logits, sample_token
from eaglewire.engine.tree import DraftTree


@dataclass
class Verdict:
    path: list[int]  # node indices of the accepted path, root first (what the target commits)
    emitted: list[int]  # target token ids: the accepted drafts, then the bonus token
    # The same two on the device (greedy verification), so committing the path and extending the
    # draft need no host-to-device copy: a copy from pageable host memory waits for the GPU.
    path_device: torch.Tensor | None = None  # [len(path)] int64
    emitted_device: torch.Tensor | None = None  # [len(emitted)] int64

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.path) - 1


def greedy_paths(
    tokens: torch.Tensor,
    ancestors: torch.Tensor,
    target_logits: torch.Tensor,
    agreed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy verification of B trees on the device, without reading anything from the host:
    tokens [B, N]; ancestors [B, N, N] bool ancestor-or-self masks (node 0 the root, parents before
    children: the target's tree mask); target_logits [B, N, V] -> [B, 1 + 2N] int64, each row
    [n, path nodes (N, first n valid, root first), emitted tokens (N, first n valid)]. agreed [B, N]
    bool: which nodes count as agreed instead of comparing tokens (a benchmark's forced acceptance,
    `engine.forced`; None in decoding).

    A node's depth is its number of strict ancestors and its parent the ancestor one level up, so
    the mask alone describes the tree (a CUDA-graphed verify forward computes this from its own
    inputs). Node i is *agreed* when its token is the target's argmax after its parent (the root
    always is); the accepted path ends at the deepest node whose ancestors are all agreed. A node's
    children carry distinct tokens, so at most one child agrees and that node is unique. Nodes on
    a path have increasing indices, so sorting gives path order, and the emitted tokens are the
    target's argmax at each path node (the last one is the bonus)."""
    B, N = tokens.shape
    index = torch.arange(N, device=tokens.device)
    target_next = target_logits.argmax(dim=-1)  # [B, N]
    depths = ancestors.sum(dim=-1) - 1  # [B, N]
    is_parent = ancestors & (depths[:, None, :] == depths[:, :, None] - 1)  # [B, N, N] [b, i, j]: j parents i
    parent = is_parent.long().argmax(dim=-1)  # [B, N] (the root: 0)
    if agreed is None:
        agreed = (tokens == target_next.gather(1, parent)) | (index == 0)  # [B, N]
    on_agreed_path = ~(ancestors & ~agreed[:, None, :]).any(dim=-1)  # [B, N]
    last = torch.where(on_agreed_path, depths, -1).argmax(dim=-1)  # [B] deepest agreed node
    on_path = ancestors.gather(1, last[:, None, None].expand(B, 1, N)).squeeze(1)  # [B, N]
    path_sorted = torch.where(on_path, index, N + index).sort(dim=-1).values % N  # [B, N] path first
    n = on_path.sum(dim=-1)  # [B]
    return torch.cat([n[:, None], path_sorted, target_next.gather(1, path_sorted)], dim=1)


def greedy_path(tree: DraftTree, target_logits: torch.Tensor) -> torch.Tensor:
    """One tree: target_logits [N, V] -> [1 + 2N] int64 on the device (see `greedy_paths`)."""
    dev = target_logits.device
    return greedy_paths(tree.tokens.to(dev)[None], tree.ancestor_mask().to(dev)[None], target_logits[None])[0]


def verdict_from_path(packed: torch.Tensor) -> Verdict:
    """packed [1 + 2N] (`greedy_paths`, one row) -> Verdict: one host read for the whole tree."""
    verdict = verdict_from_values(packed.tolist())
    n = len(verdict.path)
    N = (packed.shape[0] - 1) // 2
    verdict.path_device, verdict.emitted_device = packed[1 : 1 + n], packed[1 + N : 1 + N + n]
    return verdict


def verdict_from_values(values: list[int]) -> Verdict:
    """One `greedy_paths` row read to the host ([1 + 2N] ints) -> Verdict (host lists only)."""
    N = (len(values) - 1) // 2
    n = values[0]
    return Verdict(path=values[1 : 1 + n], emitted=values[1 + N : 1 + N + n])


@dataclass(frozen=True)
class DeviceVerdict:
    """A greedy verdict the host has not read yet: views of one `greedy_paths` row [1 + 2N], its
    path cut to the P slots that can be real (`DraftTree.max_path_nodes`), so that the next round
    can be launched from it with shapes the host knows."""

    packed: torch.Tensor  # [1 + 2N] the whole row (what the host reads later)
    count: torch.Tensor  # [1] n: accepted path nodes, root included = tokens emitted
    path: torch.Tensor  # [P] path nodes, root first; from slot n on, other nodes (padding)
    emitted: torch.Tensor  # [P] the target's token after each of them; the first n are emitted

    @classmethod
    def of(cls, packed: torch.Tensor, max_path_nodes: int) -> DeviceVerdict:
        N, P = (packed.shape[0] - 1) // 2, max_path_nodes
        return cls(packed, packed[:1], packed[1 : 1 + P], packed[1 + N : 1 + N + P])

    def bonus(self) -> torch.Tensor:
        """[1] the last emitted token: the next round's root."""
        return self.emitted.index_select(0, self.count - 1)


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> Verdict:
    """target_logits [N, V] for the tree's nodes -> the longest path the target's argmax agrees with."""
    return verdict_from_path(greedy_path(tree, target_logits))


def verify_sampling(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """target_probs [N, V] processed target distributions (on the generator's device) -> a lossless verdict."""
    tokens = tree.tokens.tolist()
    children = tree.children()
    draft_probs = None if tree.draft_probs is None else tree.draft_probs.to(target_probs.device)
    node, path, emitted = 0, [0], []
    while True:
        residual = target_probs[node].clone()
        accepted = None
        for child in children[node]:
            x = tokens[child]
            coin = float(torch.rand((), generator=generator, device=residual.device))
            if draft_probs is None:  # deterministic candidate: a point-mass draft
                if coin < float(residual[x]):
                    accepted = child
                    break
                residual[x] = 0.0
            else:  # sampled from q = draft_probs[child]
                q = draft_probs[child]
                if coin * float(q[x]) < float(residual[x]):  # coin < min(1, p/q) without dividing
                    accepted = child
                    break
                residual = (residual - q).clamp(min=0.0)
            total = float(residual.sum())
            residual = residual / total if total > 0 else target_probs[node].clone()
        if accepted is None:
            emitted.append(sample_token(residual, generator))
            return Verdict(path=path, emitted=emitted)
        emitted.append(tokens[accepted])
        path.append(accepted)
        node = accepted


def verify(
    tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> Verdict:
    """target_logits [N, V] -> Verdict: greedy or lossless sampling, as `sampling` says."""
    if sampling.greedy:
        return verify_greedy(tree, target_logits)
    if generator is None:
        raise ValueError("sampling verification needs a generator")
    probs = probs_from_logits(target_logits, sampling).to(generator.device)
    return verify_sampling(tree, probs, generator)


@dataclass
class StopRule:
    """When generation ends: max_new_tokens, an eos token (kept), or a stop string (text cut before it)."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None  # token ids -> text; needed for stop strings
    _tail_tokens: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected >= 1, got {self.max_new_tokens}")
        if self.stop_strings and self.decode is None:
            raise ValueError("stop strings need a tokenizer to decode the generated text")
        # A stop string spans at most this many of the last tokens (every token decodes to >= 1
        # character, or is a partial byte that completes within a few tokens).
        self._tail_tokens = 8 + max((len(s) for s in self.stop_strings), default=0)

    def cut(self, generated: list[int], new: list[int]) -> tuple[list[int], str | None]:
        """Of `new` tokens (following `generated`), those to keep, and the finish reason if generation ends."""
        kept: list[int] = []
        for token in new:
            kept.append(token)
            if token in self.eos_token_ids:
                return kept, "eos"
            if self.stop_strings and self._ends_with_stop(generated + kept):
                return kept, "stop_string"
            if len(generated) + len(kept) >= self.max_new_tokens:
                return kept, "max_new_tokens"
        return kept, None

    def _ends_with_stop(self, ids: list[int]) -> bool:
        assert self.decode is not None
        before = self.decode(ids[-self._tail_tokens : -1]) if len(ids) > 1 else ""
        after = self.decode(ids[-self._tail_tokens :])
        # A stop string that appears only now ends in the last token.
        return any(s in after and s not in before for s in self.stop_strings)

    def final_text(self, text: str, finish_reason: str | None) -> str:
        """The generated text without the stop string (and anything after it)."""
        if finish_reason != "stop_string":
            return text
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=len(text))
        return text[:cut]
