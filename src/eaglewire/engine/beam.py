"""The EAGLE-2 beam's bookkeeping (every candidate of a round, the frontier fed next), a top-k
with log-probabilities that suits the draft's vocabulary on a GPU, and a sort-free stable top-k
for the beam's few hundred candidates. Device tensors only: nothing here reads the host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eaglewire.nn.triton_kernels import triton_kernels_run_on

TOPK_CHUNK = 128  # top_k's first pass picks candidates inside chunks of this many entries


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] -> (values [R, k], indices [R, k]), largest first, as `x.topk(k)`.

    torch.topk gives each row one thread block, which walks a 16k-entry row in several radix
    passes (~60 us per call on an H200, 5-6 calls per round). Here k = 1 is a max, and larger k
    takes the top k of each TOPK_CHUNK-entry chunk (many small blocks) and then the top k of
    those candidates: the overall top k are always among them."""
    R, V = x.shape
    if k == 1:
        values, ids = x.max(dim=-1, keepdim=True)
        return values, ids
    if V % TOPK_CHUNK or V < 4 * TOPK_CHUNK or k > TOPK_CHUNK:
        top = x.topk(k, dim=-1)
        return top.values, top.indices
    chunks = x.view(R, V // TOPK_CHUNK, TOPK_CHUNK).topk(k, dim=-1)  # [R, C, k] each
    offsets = torch.arange(0, V, TOPK_CHUNK, device=x.device)[None, :, None]  # [1, C, 1]
    candidates = (chunks.indices + offsets).view(R, -1)  # [R, C*k] indices into V
    best = chunks.values.view(R, -1).topk(k, dim=-1)  # [R, k] over the candidates
    return best.values, candidates.gather(-1, best.indices)


TopKLogProbs = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def top_k_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] -> (ids [R, k], log-probabilities [R, k] float32) of each row's k most likely
    entries, largest first: `top_k` and a logsumexp (`top_k_log_probs_for` picks the fused kernels
    where they run)."""
    logits = logits.float()
    values, ids = top_k(logits, k)
    return ids, values - torch.logsumexp(logits, dim=-1, keepdim=True)


def top_k_log_probs_for(device: torch.device, *, fused: bool | None = None) -> TopKLogProbs:
    """The `top_k_log_probs` to run on `device`, chosen once, outside compiled code (an import or a
    lookup inside a traced function breaks its graph).

    fused: None = two Triton kernels on CUDA when Triton is there (`engine.top_k_cuda`; equal
    values by lower id), else the torch ops; True/False force one (the GPU tests compare them)."""
    if fused is None:
        fused = triton_kernels_run_on(device)
    if not fused:
        return top_k_log_probs
    from eaglewire.engine.top_k_cuda import fused_top_k_log_probs

    return fused_top_k_log_probs


def stable_ranks(scores: torch.Tensor) -> torch.Tensor:
    """scores [..., C] -> [..., C] int64: each entry's place in a stable descending sort of its row
    (equal scores keep their order). All pairs are compared at once: for the few hundred
    candidates of a round that is one fused kernel on a GPU, where a sort is a radix sort of
    several (and torch.compile cannot fuse it). Leading dims are independent rows (batched drafting)."""
    C = scores.shape[-1]
    order = torch.arange(C, device=scores.device)
    higher = scores[..., None, :] > scores[..., :, None]  # [..., C, C]: [i, j] = j outranks i
    earlier_tie = (scores[..., None, :] == scores[..., :, None]) & (order[None, :] < order[:, None])
    return (higher | earlier_tie).sum(dim=-1)


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [..., C] -> [..., k] indices of each row's k best, best first, equal scores in index
    order (as `torch.sort(scores, descending=True, stable=True).indices[..., :k]`)."""
    places = torch.arange(k, device=scores.device)
    return (stable_ranks(scores)[..., None, :] == places[:, None]).int().argmax(dim=-1)  # [..., k]


@dataclass
class CandidatePool:
    """Every candidate drafted this round, in creation order (a parent before its children)."""

    tokens: list[torch.Tensor] = field(default_factory=list)  # target ids
    scores: list[torch.Tensor] = field(default_factory=list)  # cumulative draft log-probabilities
    parents: list[torch.Tensor] = field(default_factory=list)  # pool index of the parent, -1 = root
    depths: list[torch.Tensor] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # sampled chains: the distribution drawn from
    size: int = 0

    def add(
        self,
        tokens: torch.Tensor,
        scores: torch.Tensor,
        parents: torch.Tensor,
        *,
        depth: int,
        q: torch.Tensor | None,
    ) -> torch.Tensor:
        """Append candidates; return their pool indices."""
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.append(parents)
        self.depths.append(torch.full_like(parents, depth))
        if q is not None:
            self.q.append(q)
        index = torch.arange(self.size, self.size + tokens.shape[0], device=tokens.device)
        self.size += tokens.shape[0]
        return index


@dataclass
class Frontier:
    """The beam: the K best nodes of the deepest level, about to be fed as draft rows."""

    index: torch.Tensor  # [K] pool indices
    scores: torch.Tensor  # [K] cumulative log-probabilities
    tokens: torch.Tensor  # [K] target ids
    hidden: torch.Tensor  # [1, K, H] each node's input hidden: its parent row's output
    sees: torch.Tensor  # [K, R] which of the R tree rows already in the cache are its ancestors
