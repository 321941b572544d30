"""Drafting for B rows at once: one draft cache of [Bmax] rows, one beam per row, one forward per step.

The same EAGLE-3 rounds as `engine.drafting.Drafter` (its module doc has the row convention and the
beam), with a batch axis in front of everything: row b's committed count, root and positions are
entries of [B] device tensors, so rows at different lengths share every forward. A row never sees
another row's cache (each row attends to its own slots), so each row's tree is the tree that row
would get alone (up to float rounding of the batched products).

    prefill_row(b, aux, tokens)      a new request's prompt rows, one row at a time (eager)
    draft_trees(roots, positions)    -> RowTrees [B, N]: num_steps - 1 batched forwards + selection
    extend_verified(aux, paths, ...) the accepted rows of every row of the batch, one forward

On CUDA `draft_trees` and `extend_verified` replay one CUDA graph per (batch size, setting, attended
window) around torch.compile'd code; on CPU they run eagerly (the path the lossless tests pin).
Sampled chains (topk = 1, temperature > 0 rows) draw each row's tokens with that row's own
generator, eagerly, in the order a row decoded alone draws them.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from eaglewire.draft.model import DraftOutput, Eagle3Draft, attend
from eaglewire.engine.beam import top_indices, top_k_log_probs_for
from eaglewire.engine.runners.fast.graphs import GraphCache, own_code
from eaglewire.engine.runners.fast.kv_cache import kv_bucket
from eaglewire.engine.sampling import SamplingParams, probs_from_logits
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.tree import ancestor_mask, select_nodes
from eaglewire.errors import ConfigError, expected_actual

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 24  # compiled variants of the draft forward (see BatchDrafter._step)


@dataclass(frozen=True)
class RowTrees:
    """One draft tree per batch row, all of N nodes (node 0 the row's root). Device tensors."""

    tokens: torch.Tensor  # [B, N] target ids
    parents: torch.Tensor  # [B, N] (-1 for the root)
    depths: torch.Tensor  # [B, N]
    ancestors: torch.Tensor  # [B, N, N] bool ancestor-or-self: the target's tree mask
    depth_limit: int  # bound on depths (num_steps)
    draft_probs: torch.Tensor | None = None  # [B, N, V] sampled chains: what each node was drawn from

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def max_path_nodes(self) -> int:
        return min(self.depth_limit + 1, self.num_nodes)


@dataclass(frozen=True)
class RowSampler:
    """How one row of a sampled chain draws its drafts: its processed distribution and generator."""

    params: SamplingParams
    generator: torch.Generator


class RowDraftCache:
    """The draft layer's keys/values for Bmax rows, [Bmax, nkv, capacity, hd] each, preallocated.
    `write(first, slots, window)` says where the next append's rows go: batch row i's T new rows
    at cache row first + i, slots slots[i] ([B, T]); attention reads those rows' first `window`
    slots (views: rows are always a contiguous range)."""

    def __init__(
        self,
        max_rows: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (max_rows, num_kv_heads, capacity, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros_like(self.key)
        self.capacity = capacity
        self._first = 0
        self._slots: torch.Tensor | None = None  # [B, T]
        self._window = 0

    def write(self, first: int, slots: torch.Tensor, window: int) -> None:
        self._first, self._slots, self._window = first, slots.clamp(max=self.capacity - 1), window

    def attend(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q [B, nh, T, hd]; new key/value [B, nkv, T, hd] stored at the written slots; mask [B, 1, T, W]."""
        if self._slots is None:
            raise RuntimeError("RowDraftCache.attend before write(): where the rows go is not set")
        B, T = self._slots.shape
        keys = self.key[self._first : self._first + B]  # [B, nkv, capacity, hd] (a view)
        values = self.value[self._first : self._first + B]
        rows = torch.arange(B, device=keys.device)[:, None].expand(B, T)
        keys[rows, :, self._slots] = key.transpose(1, 2)  # [B, T, nkv, hd]
        values[rows, :, self._slots] = value.transpose(1, 2)
        return attend(q, keys[:, :, : self._window], values[:, :, : self._window], mask)

    def move_row(self, src: int, dst: int) -> None:
        self.key[dst] = self.key[src]
        self.value[dst] = self.value[src]


class BatchDrafter:
    """Owns the draft's cache for up to `max_rows` rows and each row's last committed output."""

    def __init__(
        self,
        draft: Eagle3Draft,
        spec: SpecArgs,
        *,
        max_rows: int,
        max_seq_len: int,
        cuda_graphs: bool | None = None,
        compile: bool | None = None,
    ) -> None:
        if spec.topk > draft.config.draft_vocab_size:
            raise ConfigError(
                expected_actual(
                    "topk", f"<= the draft vocabulary ({draft.config.draft_vocab_size})", spec.topk
                )
            )
        draft.fuse_weights()
        self.draft = draft
        self.spec = spec
        self.max_rows = max_rows
        self.device = next(draft.parameters()).device
        self.dtype = next(draft.parameters()).dtype
        cfg = draft.config
        self.vocab_size = cfg.vocab_size
        self.draft_to_target = cast(torch.Tensor, draft.draft_to_target)  # [Vd]
        self._top_k_log_probs = top_k_log_probs_for(self.device)
        # room for the longest sequence plus the provisional rows of the widest round
        self.capacity = max_seq_len + spec.topk * spec.num_steps + spec.num_steps + 1
        self.cache = RowDraftCache(
            max_rows,
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.capacity,
            dtype=self.dtype,
            device=self.device,
        )
        on_cuda = self.device.type == "cuda"
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        if self.use_graphs and not on_cuda:
            raise ConfigError(
                "BatchDrafter: cuda_graphs=True needs the draft on CUDA", fix="cuda_graphs=None"
            )
        self._graphs = GraphCache(self.device) if self.use_graphs else None
        draft.rope(torch.zeros(1, 1, dtype=torch.long, device=self.device), self.dtype)  # table on device
        self.compiled = self.use_graphs if compile is None else compile
        if self.compiled:  # every cache dim is fixed: only the window and the batch vary
            for buffer in (self.cache.key, self.cache.value):
                torch._dynamo.mark_static(buffer)
        forward = types.MethodType(own_code(type(draft).forward), draft)
        self._forward = torch.compile(forward, dynamic=True) if self.compiled else draft.forward
        if self.compiled:
            # batch 1 or more, one token or more, extend or tree step: ~10 specialisations, past the
            # default limit of 8 (beyond which dynamo runs new shapes uncompiled). The limit is
            # read when a frame recompiles, process-wide (a patch around the calls did not hold).
            dynamo_config = torch._dynamo.config
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        dev = self.device
        self._slots = torch.arange(self.capacity, device=dev)  # [capacity]
        self.committed = torch.zeros(max_rows, dtype=torch.long, device=dev)  # [Bmax] rows kept per row
        self._bound = [0] * max_rows  # host upper bound of `committed` per row (exact in lockstep)
        self.last_hidden = torch.zeros(max_rows, 1, cfg.hidden_size, dtype=self.dtype, device=dev)
        self.last_logits = torch.zeros(max_rows, cfg.draft_vocab_size, device=dev)  # [Bmax, Vd] float32

    # -- rows --------------------------------------------------------------------------------------
    def reset_rows(self, rows: Sequence[int]) -> None:
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.committed[idx] = 0
        self.last_hidden[idx] = 0
        self.last_logits[idx] = 0
        for r in rows:
            self._bound[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        self.committed[dst] = self.committed[src]
        self.last_hidden[dst] = self.last_hidden[src]
        self.last_logits[dst] = self.last_logits[src]
        self._bound[dst] = self._bound[src]
        self.reset_rows([src])

    @torch.no_grad()
    def prefill_row(self, row: int, aux: torch.Tensor, tokens: torch.Tensor) -> None:
        """A new request's prompt: aux [n, A*Ht] target states at positions 0..n-1, tokens [n] the
        tokens after them, into empty row `row` (eagerly: a prompt's width varies)."""
        n = int(tokens.shape[0])
        if n == 0:
            return
        dev = self.device
        positions = self._slots[:n]  # [n]
        window = kv_bucket(n, self.capacity)
        self.cache.write(row, positions[None], window)
        mask = self._slots[:window][None, :] <= positions[:, None]  # [n, W] causal
        hidden = self.draft.project(aux.to(dev, self.dtype)[None])  # [1, n, H]
        out = self.draft.forward(
            tokens.to(dev)[None],
            hidden,
            positions[None],
            kv=self.cache,
            mask=mask[None, None],
            compute_logits=False,
        )
        last = out.hidden[:, -1:]  # [1, 1, H]
        self.last_hidden[row] = last[0]
        self.last_logits[row] = self.draft.compute_logits(last)[0, 0].float()
        self.committed[row] = n
        self._bound[row] = n

    # -- rounds --------------------------------------------------------------------------------
    @torch.no_grad()
    def draft_trees(
        self,
        root_tokens: torch.Tensor,
        root_positions: torch.Tensor,
        spec: SpecArgs | None = None,
        samplers: Sequence[RowSampler | None] | None = None,
    ) -> RowTrees:
        """The trees to verify next for rows 0..B-1: root_tokens, root_positions [B] (device); spec:
        this round's setting (default the drafter's; a shorter one drafts less at large batches);
        samplers: per row, how a sampled chain draws (None = top-k candidates)."""
        spec = spec or self.spec
        B = int(root_tokens.shape[0])
        window = self._window(B, spec.topk * (spec.num_steps - 1))
        sampled = spec.is_chain and samplers is not None and any(s is not None for s in samplers)
        if sampled or self._graphs is None:
            return self._draft_rows(
                B, root_tokens, root_positions, spec, window, samplers if sampled else None
            )

        def make_inputs() -> dict[str, torch.Tensor]:
            return {
                "roots": torch.zeros(B, dtype=torch.long, device=self.device),
                "positions": torch.zeros(B, dtype=torch.long, device=self.device),
            }

        def body(inp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            trees = self._draft_rows(B, inp["roots"], inp["positions"], spec, window, None)
            return trees.tokens, trees.parents, trees.depths, trees.ancestors

        out = self._replay(
            ("draft", B, spec, window), make_inputs, body, {"roots": root_tokens, "positions": root_positions}
        )
        if out is None:
            return self._draft_rows(B, root_tokens, root_positions, spec, window, None)
        tokens, parents, depths, ancestors = out
        return RowTrees(tokens, parents, depths, ancestors, depth_limit=spec.num_steps)

    @torch.no_grad()
    def extend_verified(
        self,
        aux: torch.Tensor,
        paths: torch.Tensor,
        tokens: torch.Tensor,
        counts: torch.Tensor,
        counts_host: Sequence[int],
    ) -> None:
        """Every row's accepted rows: aux [B, N, A*Ht] the verify forward's states, paths [B, P] the
        accepted nodes root first (slots past counts[b] are padding), tokens [B, P] the token after
        each, counts [B] (device) and counts_host how many are real (0: the row is idle). All P rows
        are fed (one graph per window serves every count); rows past the count are provisional."""
        B, P = paths.shape
        window = self._window(B, P)
        values = {"aux": aux, "paths": paths, "tokens": tokens, "counts": counts}

        def make_inputs() -> dict[str, torch.Tensor]:
            return {
                "aux": torch.zeros(aux.shape, dtype=aux.dtype, device=self.device),
                "paths": torch.zeros(B, P, dtype=torch.long, device=self.device),
                "tokens": torch.zeros(B, P, dtype=torch.long, device=self.device),
                "counts": torch.zeros(B, dtype=torch.long, device=self.device),
            }

        def body(inp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            self._extend_rows(inp["aux"], inp["paths"], inp["tokens"], inp["counts"], window)
            return ()

        key = ("extend", B, tuple(aux.shape), P, window)
        if self._replay(key, make_inputs, body, values) is None:
            self._extend_rows(aux, paths, tokens, counts, window)
        for b in range(B):
            self._bound[b] += int(counts_host[b])

    # -- device work (graph-capturable) ---------------------------------------------------------
    def _window(self, B: int, new_rows: int) -> int:
        need = max(self._bound[:B], default=0) + new_rows
        if need > self.capacity:
            raise ConfigError(
                f"draft cache full: a row needs {need} rows, the cache holds {self.capacity}",
                fix="build the BatchDrafter with a larger max_seq_len",
            )
        return kv_bucket(need, self.capacity)

    def _replay(
        self,
        key: tuple[object, ...],
        make_inputs: Callable[[], dict[str, torch.Tensor]],
        fn: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]],
        values: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, ...] | None:
        if self._graphs is None:
            return None
        try:
            graph = self._graphs.get(key, make_inputs, fn)
        except RuntimeError as err:  # torch.compile's errors are RuntimeErrors too
            log.warning("batched draft CUDA graph %s failed (%s); drafting eagerly from now on", key, err)
            self._graphs = None
            return None
        return graph.run(values)

    def _extend_rows(
        self, aux: torch.Tensor, paths: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, window: int
    ) -> None:
        B, P = paths.shape
        start = self.committed[:B]  # [B]
        positions = start[:, None] + self._slots[:P]  # [B, P]
        self.cache.write(0, positions, window)
        mask = self._slots[:window][None, None, :] <= positions[:, :, None]  # [B, P, W] causal per row
        picked = aux.to(self.dtype).gather(1, paths[:, :, None].expand(B, P, aux.shape[-1]))  # [B, P, A*Ht]
        out = self._step(tokens, self.draft.project(picked), positions, mask)
        last = (counts - 1).clamp(min=0)  # [B] the last real row (an idle row keeps its state)
        kept = out.hidden.gather(1, last[:, None, None].expand(B, 1, out.hidden.shape[-1]))  # [B, 1, H]
        live = (counts > 0)[:, None, None]
        self.last_hidden[:B] = torch.where(live, kept, self.last_hidden[:B])
        logits = self.draft.compute_logits(kept)[:, 0].float()  # [B, Vd]
        self.last_logits[:B] = torch.where(live[:, 0], logits, self.last_logits[:B])
        self.committed[:B] += counts

    def _step(
        self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> DraftOutput:
        """One draft forward of [B, T] rows (no logits: callers take the head where they need it, so
        the compiled forward has one variant per batch-of-1 / tokens-of-1 case, not two)."""
        if self.compiled:
            torch._dynamo.maybe_mark_dynamic(mask, 2)  # the attended window varies from the first call
        return self._forward(
            tokens, hidden, positions, kv=self.cache, mask=mask[:, None], compute_logits=False
        )

    def _draft_rows(
        self,
        B: int,
        roots: torch.Tensor,
        root_positions: torch.Tensor,
        spec: SpecArgs,
        window: int,
        samplers: Sequence[RowSampler | None] | None,
    ) -> RowTrees:
        """num_steps - 1 batched forwards of every row's beam, then EAGLE-2 selection per row."""
        K = spec.topk
        dev = self.device
        ids, logp, q = self._children(self.last_logits[:B], K, samplers)  # [B, K] each
        tokens = self.draft_to_target[ids]  # [B, K]
        pool_tokens, pool_scores, pool_parents, pool_depths = (
            [tokens],
            [logp],
            [torch.full_like(ids, -1)],
            [torch.ones_like(ids)],
        )
        pool_q = [] if q is None else [q.view(B, K, -1)]
        index = torch.arange(K, device=dev).expand(B, K)  # pool index of each frontier node
        scores, hidden = logp, self.last_hidden[:B].expand(B, K, -1).contiguous()  # [B, K], [B, K, H]
        sees = torch.zeros(B, K, 0, dtype=torch.bool, device=dev)  # [B, K, R] tree rows each node sees
        size = K
        beam_rows = torch.arange(K * K, device=dev) // K  # [K*K] frontier row of each child
        for depth in range(1, spec.num_steps):
            R = sees.shape[2]
            sees = torch.cat([sees, torch.eye(K, dtype=torch.bool, device=dev).expand(B, K, K)], dim=2)
            slots = self.committed[:B, None] + R + self._slots[:K]  # [B, K]
            self.cache.write(0, slots, window)
            tree_row = self._slots[:window][None, :] - self.committed[:B, None]  # [B, W] (<0: committed)
            in_tree = (tree_row >= 0) & (tree_row < R + K)
            seen = sees.gather(2, tree_row.clamp(0, R + K - 1)[:, None, :].expand(B, K, window))  # [B, K, W]
            mask = (tree_row < 0)[:, None, :] | (seen & in_tree[:, None, :])  # [B, K, W]
            positions = (root_positions[:, None] + (depth - 1)).expand(B, K).contiguous()  # [B, K]
            out = self._step(tokens, hidden, positions, mask)
            logits = self.draft.compute_logits(out.hidden)  # [B, K, Vd]
            ids, logp, q = self._children(logits.reshape(B * K, -1), K, samplers)  # [B*K, K]
            child_scores = (scores[:, :, None] + logp.view(B, K, K)).reshape(B, K * K)  # cumulative
            child_tokens = self.draft_to_target[ids].view(B, K * K)
            child_index = torch.arange(size, size + K * K, device=dev).expand(B, K * K)
            pool_tokens.append(child_tokens)
            pool_scores.append(child_scores)
            pool_parents.append(index[:, beam_rows])
            pool_depths.append(torch.full_like(child_index, depth + 1))
            if q is not None:
                pool_q.append(q.view(B, K * K, -1))
            size += K * K
            best = top_indices(child_scores, K)  # [B, K] the next beam
            parent_row = beam_rows[best]  # [B, K]
            index, scores, tokens = (
                child_index.gather(1, best),
                child_scores.gather(1, best),
                child_tokens.gather(1, best),
            )
            hidden = out.hidden.gather(1, parent_row[:, :, None].expand(B, K, out.hidden.shape[-1]))
            sees = sees.gather(1, parent_row[:, :, None].expand(B, K, sees.shape[2]))
        all_scores = torch.cat(pool_scores, dim=1)  # [B, C]
        kept, parents = select_nodes(all_scores, torch.cat(pool_parents, dim=1), spec.num_draft_tokens - 1)
        zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
        node_tokens = torch.cat(
            [roots[:, None], torch.cat(pool_tokens, dim=1).gather(1, kept)], dim=1
        )  # [B, N]
        depths = torch.cat([zero, torch.cat(pool_depths, dim=1).gather(1, kept)], dim=1)
        draft_probs = None
        if pool_q:  # a sampled chain: row 0 (the root) was not drafted
            qs = torch.cat(pool_q, dim=1)  # [B, C, V]
            picked = qs.gather(1, kept[:, :, None].expand(B, kept.shape[1], qs.shape[-1]))
            draft_probs = torch.cat([torch.zeros(B, 1, qs.shape[-1], device=dev), picked], dim=1)
        return RowTrees(
            node_tokens,
            parents,
            depths,
            ancestor_mask(parents, max_depth=spec.num_steps),
            depth_limit=spec.num_steps,
            draft_probs=draft_probs,
        )

    def _children(
        self, logits: torch.Tensor, K: int, samplers: Sequence[RowSampler | None] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """logits [R, Vd] (R = B rows, or B*K frontier nodes in row order) -> draft ids [R, K],
        log-probs [R, K], and for a sampled chain (K = 1) q [R, V]: what each row's child was drawn
        from (greedy rows of such a batch take their argmax and a one-hot q)."""
        if samplers is None:
            ids, logp = self._top_k_log_probs(logits, K)
            return ids, logp, None
        logits = logits.float()
        logp_all = torch.log_softmax(logits, dim=-1)
        ids = logits.argmax(dim=-1, keepdim=True)  # [R, 1]
        probs = torch.zeros_like(logits).scatter(-1, ids, 1.0)  # [R, Vd] one-hot for greedy rows
        for r, sampler in enumerate(samplers):
            if sampler is not None:  # one row's draw, with its generator, as that row alone draws it
                row_probs = probs_from_logits(logits[r : r + 1], sampler.params)  # [1, Vd]
                ids[r] = torch.multinomial(row_probs, 1, generator=sampler.generator)[0]
                probs[r] = row_probs[0]
        q = torch.zeros(logits.shape[0], self.vocab_size, device=self.device)
        q.index_add_(1, self.draft_to_target, probs)  # [R, V] over target ids
        return ids, logp_all.gather(-1, ids), q
