"""Drafting with the EAGLE-3 draft and its own KV cache: chains and EAGLE-2 dynamic trees.

Row convention (the one training uses): draft row t pairs the target's aux states at position t
with the token at position t + 1, sits at position t, and predicts the token at t + 2.

Each round:
  1. `extend`: feed the rows the last verification made certain: aux of the accepted path
     (root .. last accepted node, from the verify forward) with the tokens that follow them
     (the accepted drafts and the bonus). Their K/V stay in the draft cache for good.
     The first step's hidden is `draft.project(aux)`.
  2. `draft`: the last extend row's logits give the depth-1 candidates (top-k). Each further step
     (num_steps - 1 of them) feeds the current frontier as rows whose hidden is the draft's own
     output for its parent (later steps never see target states), attending to the committed
     cache plus the rows of its ancestors. Top-k children per frontier row are scored by
     cumulative log-probability; the best topk of them form the next frontier (SGLang/EAGLE-2
     beam). Finally the best num_draft_tokens - 1 of all candidates form the tree.
  Tree rows are provisional: the next `extend` truncates the cache back to the committed rows.

Sampled chains (topk = 1, temperature > 0) draw each token from the processed draft
distribution and keep that distribution for lossless rejection sampling. Trees keep
deterministic top-k candidates (as EAGLE and SGLang do); verification treats them as point
masses, which is lossless too. No host synchronisation happens inside `draft`.
"""

from __future__ import annotations

from typing import cast

import torch

from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.sampling import SamplingParams, probs_from_logits
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.tree import DraftTree, root_only, select_nodes

INITIAL_CACHE_ROWS = 256


class DraftCache:
    """A `DraftKV` with a committed prefix and provisional rows after it; grows by doubling."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None  # [B, nkv, capacity, hd]
        self.value: torch.Tensor | None = None
        self.length = 0

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new [B, nkv, T, hd] keys/values; return views of all [B, nkv, length, hd]."""
        new_length = self.length + key.shape[2]
        if self.key is None or self.value is None or new_length > self.key.shape[2]:
            self._grow(key, value, new_length)
        assert self.key is not None and self.value is not None
        self.key[:, :, self.length : new_length] = key
        self.value[:, :, self.length : new_length] = value
        self.length = new_length
        return self.key[:, :, :new_length], self.value[:, :, :new_length]

    def _grow(self, key: torch.Tensor, value: torch.Tensor, needed: int) -> None:
        capacity = max(INITIAL_CACHE_ROWS, needed, 2 * (0 if self.key is None else self.key.shape[2]))
        B, nkv, _, hd = key.shape
        new_key = key.new_empty(B, nkv, capacity, hd)
        new_value = value.new_empty(B, nkv, capacity, value.shape[-1])
        if self.key is not None and self.value is not None and self.length:
            new_key[:, :, : self.length] = self.key[:, :, : self.length]
            new_value[:, :, : self.length] = self.value[:, :, : self.length]
        self.key, self.value = new_key, new_value

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot truncate the draft cache to {length} rows: it holds {self.length}")
        self.length = length


class Drafter:
    """Batch 1. Owns the draft's cache; `extend` after every verification, then `draft`."""

    def __init__(self, draft: Eagle3Draft, spec: SpecArgs) -> None:
        if spec.topk > draft.config.draft_vocab_size:
            raise ValueError(f"topk={spec.topk} exceeds the draft vocabulary ({draft.config.draft_vocab_size})")
        self.draft = draft
        self.spec = spec
        self.device = next(draft.parameters()).device
        self.dtype = next(draft.parameters()).dtype
        self.vocab_size = draft.config.vocab_size
        self.draft_to_target = cast(torch.Tensor, draft.draft_to_target)  # [Vd] absolute target ids
        self.cache = DraftCache()
        self.committed = 0  # cache rows that belong to accepted tokens
        self.last_hidden: torch.Tensor | None = None  # [1, 1, H] output of the last committed row
        self.last_logits: torch.Tensor | None = None  # [Vd] its logits

    def reset(self) -> None:
        self.cache = DraftCache()
        self.committed = 0
        self.last_hidden = self.last_logits = None

    @torch.no_grad()
    def extend(self, aux: torch.Tensor, tokens: torch.Tensor, start_position: int) -> None:
        """aux [n, A*Ht] target states at positions start..start+n-1; tokens [n] the tokens after them."""
        if start_position != self.committed:
            raise ValueError(f"draft rows must be contiguous: next row is {self.committed}, got {start_position}")
        self.cache.truncate(self.committed)  # drop the last round's provisional tree rows
        n = tokens.shape[0]
        hidden = self.draft.project(aux[None].to(device=self.device, dtype=self.dtype))  # [1, n, H]
        positions = torch.arange(start_position, start_position + n, device=self.device)[None]
        out = self.draft(tokens[None].to(self.device), hidden, positions, kv=self.cache, compute_logits=False)
        self.committed += n
        self.last_hidden = out.hidden[:, -1:]  # [1, 1, H]
        self.last_logits = self.draft.compute_logits(self.last_hidden)[0, 0].float()  # [Vd]

    @torch.no_grad()
    def draft_tree(self, root_token: int, root_position: int, sampling: SamplingParams,
                   generator: torch.Generator | None = None) -> DraftTree:
        """The tree to verify next: root (not yet in the target cache) at `root_position` plus drafts."""
        if self.last_hidden is None or self.last_logits is None:
            return root_only(root_token, self.device)  # nothing to draft from yet (one-token prompt)
        K = self.spec.topk
        sampled_chain = self.spec.is_chain and not sampling.greedy
        d2t = self.draft_to_target

        # Candidate pool, in creation order (a parent before its children).
        pool_tokens: list[torch.Tensor] = []
        pool_scores: list[torch.Tensor] = []
        pool_parents: list[torch.Tensor] = []
        pool_depths: list[torch.Tensor] = []
        pool_q: list[torch.Tensor] = []

        ids, logp, q = self._children(self.last_logits[None], sampling, generator)  # [1, K] each
        frontier = torch.arange(K, device=self.device)  # pool indices of the frontier
        frontier_scores = logp[0]  # [K]
        frontier_tokens = d2t[ids[0]]  # [K] target ids
        frontier_hidden = self.last_hidden.expand(1, K, -1)  # [1, K, H] output of each frontier node's parent row
        frontier_sees = torch.zeros(K, 0, dtype=torch.bool, device=self.device)  # tree rows each frontier row sees
        self._add(pool_tokens, pool_scores, pool_parents, pool_depths, frontier_tokens, frontier_scores,
                  torch.full((K,), -1, device=self.device), depth=1)
        if q is not None:
            pool_q.append(q)
        pool_size = K

        for depth in range(1, self.spec.num_steps):
            # Feed the frontier (nodes at `depth`) as draft rows at positions root_position + depth - 1.
            rows_sees = torch.cat([frontier_sees, torch.eye(K, dtype=torch.bool, device=self.device)], dim=1)
            mask = torch.cat([torch.ones(K, self.committed, dtype=torch.bool, device=self.device), rows_sees], dim=1)
            positions = torch.full((1, K), root_position + depth - 1, device=self.device)
            out = self.draft(frontier_tokens[None], frontier_hidden, positions, kv=self.cache, mask=mask)
            ids, logp, q = self._children(out.logits[0], sampling, generator)  # [K, K]
            child_scores = (frontier_scores[:, None] + logp).flatten()  # [K*K]
            child_tokens = d2t[ids].flatten()  # [K*K]
            child_row = torch.arange(K, device=self.device).repeat_interleave(K)  # frontier row of each child
            self._add(pool_tokens, pool_scores, pool_parents, pool_depths, child_tokens, child_scores,
                      frontier[child_row], depth=depth + 1)
            if q is not None:
                pool_q.append(q)
            best = torch.sort(child_scores, descending=True, stable=True).indices[:K]
            frontier = pool_size + best
            pool_size += K * K
            frontier_scores = child_scores[best]
            frontier_tokens = child_tokens[best]
            frontier_hidden = out.hidden[:, child_row[best]]
            frontier_sees = rows_sees[child_row[best]]

        scores = torch.cat(pool_scores)
        kept, parents = select_nodes(scores, torch.cat(pool_parents), self.spec.num_draft_tokens - 1)
        root = torch.full((1,), root_token, dtype=torch.long, device=self.device)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        draft_probs = None
        if sampled_chain:
            draft_probs = torch.cat([torch.zeros(1, self.vocab_size, device=self.device), torch.cat(pool_q)[kept]])
        return DraftTree(
            tokens=torch.cat([root, torch.cat(pool_tokens)[kept]]),
            parents=parents,
            depths=torch.cat([zero, torch.cat(pool_depths)[kept]]),
            depth_limit=self.spec.num_steps,
            draft_probs=draft_probs,
            scores=torch.cat([zero.float(), scores[kept]]),
        )

    def _children(
        self, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """logits [R, Vd] -> (draft ids [R, K], their log-probs [R, K], q [R, V] or None).

        Top-k by draft probability, except a sampled chain, which draws its one child from the
        processed draft distribution and returns that distribution (in target ids) as q.
        """
        logp = torch.log_softmax(logits.float(), dim=-1)
        if not (self.spec.is_chain and not sampling.greedy):
            top = logp.topk(self.spec.topk, dim=-1)
            return top.indices, top.values, None
        probs = probs_from_logits(logits, sampling)  # [R, Vd]
        ids = torch.multinomial(probs, 1, generator=generator)  # [R, 1]
        q = torch.zeros(logits.shape[0], self.vocab_size, device=self.device)
        q.index_add_(1, self.draft_to_target, probs)  # [R, V] draft distribution over target ids
        return ids, logp.gather(-1, ids), q

    @staticmethod
    def _add(tokens: list[torch.Tensor], scores: list[torch.Tensor], parents: list[torch.Tensor],
             depths: list[torch.Tensor], new_tokens: torch.Tensor, new_scores: torch.Tensor,
             new_parents: torch.Tensor, *, depth: int) -> None:
        tokens.append(new_tokens)
        scores.append(new_scores)
        parents.append(new_parents)
        depths.append(torch.full_like(new_parents, depth))
