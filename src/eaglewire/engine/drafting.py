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

from dataclasses import dataclass, field
from typing import cast

import torch

from eaglewire.draft.model import DraftOutput, Eagle3Draft
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


@dataclass
class _Pool:
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
class _Frontier:
    """The beam: the K best nodes of the deepest level, about to be fed as draft rows."""

    index: torch.Tensor  # [K] pool indices
    scores: torch.Tensor  # [K] cumulative log-probabilities
    tokens: torch.Tensor  # [K] target ids
    hidden: torch.Tensor  # [1, K, H] each node's input hidden: its parent row's output
    sees: torch.Tensor  # [K, R] which of the R tree rows already in the cache are its ancestors


class Drafter:
    """Batch 1. Owns the draft's cache; `extend` after every verification, then `draft`."""

    def __init__(self, draft: Eagle3Draft, spec: SpecArgs) -> None:
        if spec.topk > draft.config.draft_vocab_size:
            raise ValueError(
                f"topk={spec.topk} exceeds the draft vocabulary ({draft.config.draft_vocab_size})"
            )
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
            raise ValueError(
                f"draft rows must be contiguous: next row is {self.committed}, got {start_position}"
            )
        self.cache.truncate(self.committed)  # drop the last round's provisional tree rows
        n = tokens.shape[0]
        hidden = self.draft.project(aux[None].to(device=self.device, dtype=self.dtype))  # [1, n, H]
        positions = torch.arange(start_position, start_position + n, device=self.device)[None]
        out = self.draft(tokens[None].to(self.device), hidden, positions, kv=self.cache, compute_logits=False)
        self.committed += n
        self.last_hidden = out.hidden[:, -1:]  # [1, 1, H]
        self.last_logits = self.draft.compute_logits(self.last_hidden)[0, 0].float()  # [Vd]

    @torch.no_grad()
    def draft_tree(
        self,
        root_token: int,
        root_position: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        """The tree to verify next: root (not yet in the target cache) at `root_position` plus drafts."""
        if self.last_hidden is None or self.last_logits is None:
            return root_only(root_token, self.device)  # nothing to draft from yet (one-token prompt)
        K = self.spec.topk
        pool = _Pool()

        ids, logp, q = self._children(self.last_logits[None], sampling, generator)  # [1, K] each
        tokens = self.draft_to_target[ids[0]]  # [K] target ids
        no_parent = torch.full((K,), -1, device=self.device)
        frontier = _Frontier(
            index=pool.add(tokens, logp[0], no_parent, depth=1, q=q),
            scores=logp[0],
            tokens=tokens,
            hidden=self.last_hidden.expand(1, K, -1),  # depth-1 nodes continue the last committed row
            sees=torch.zeros(K, 0, dtype=torch.bool, device=self.device),
        )
        for depth in range(1, self.spec.num_steps):
            out, sees = self._feed(frontier, position=root_position + depth - 1)
            ids, logp, q = self._children(out.logits[0], sampling, generator)  # [K, K] each
            scores = (frontier.scores[:, None] + logp).flatten()  # [K*K] cumulative log-probs
            tokens = self.draft_to_target[ids].flatten()  # [K*K]
            row = torch.arange(K, device=self.device).repeat_interleave(K)  # frontier row of each child
            index = pool.add(tokens, scores, frontier.index[row], depth=depth + 1, q=q)
            best = torch.sort(scores, descending=True, stable=True).indices[:K]  # the next beam
            frontier = _Frontier(
                index=index[best],
                scores=scores[best],
                tokens=tokens[best],
                hidden=out.hidden[:, row[best]],
                sees=sees[row[best]],
            )
        return self._select(pool, root_token)

    def _feed(self, frontier: _Frontier, position: int) -> tuple[DraftOutput, torch.Tensor]:
        """Run the frontier as K new draft rows at `position`; each sees the committed rows, its
        ancestors' rows and itself. Returns the output and the rows each new row sees [K, R+K]."""
        K = frontier.tokens.shape[0]
        sees = torch.cat([frontier.sees, torch.eye(K, dtype=torch.bool, device=self.device)], dim=1)
        committed = torch.ones(K, self.committed, dtype=torch.bool, device=self.device)
        mask = torch.cat([committed, sees], dim=1)  # [K, S] over every key in the cache
        positions = torch.full((1, K), position, device=self.device)
        out = self.draft(frontier.tokens[None], frontier.hidden, positions, kv=self.cache, mask=mask)
        return out, sees

    def _select(self, pool: _Pool, root_token: int) -> DraftTree:
        """EAGLE-2 reranking: the best num_draft_tokens - 1 candidates, under the root."""
        scores = torch.cat(pool.scores)
        kept, parents = select_nodes(scores, torch.cat(pool.parents), self.spec.num_draft_tokens - 1)
        root = torch.full((1,), root_token, dtype=torch.long, device=self.device)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        draft_probs = None
        if pool.q:  # a sampled chain: row 0 (the root) was not drafted
            no_q = torch.zeros(1, self.vocab_size, device=self.device)
            draft_probs = torch.cat([no_q, torch.cat(pool.q)[kept]])
        return DraftTree(
            tokens=torch.cat([root, torch.cat(pool.tokens)[kept]]),
            parents=parents,
            depths=torch.cat([zero, torch.cat(pool.depths)[kept]]),
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
