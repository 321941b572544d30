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
  Tree rows are provisional: the next `extend` writes its rows over them.

Sampled chains (topk = 1, temperature > 0) draw each token from the processed draft
distribution and keep that distribution for lossless rejection sampling. Trees keep
deterministic top-k candidates (as EAGLE and SGLang do); verification treats them as point
masses, which is lossless too. No host synchronisation happens inside `draft`.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import cast

import torch

from eaglewire.draft.model import DraftOutput, Eagle3Draft
from eaglewire.engine.beam import CandidatePool, Frontier, top_indices, top_k_log_probs_for
from eaglewire.engine.draft_cache import INITIAL_CACHE_ROWS, DraftCache
from eaglewire.engine.runners.fast.graphs import GraphCache, own_code
from eaglewire.engine.runners.fast.kv_cache import PREFILL_MAX_WIDTH, kv_bucket, prefill_width
from eaglewire.engine.sampling import SamplingParams, probs_from_logits
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.tree import DeviceRoot, DraftTree, root_only, select_nodes
from eaglewire.engine.verify import DeviceVerdict
from eaglewire.errors import ConfigError

log = logging.getLogger(__name__)

TOP_K_ROUND = SamplingParams()  # what a graphed round is built with (see Drafter._capture_tree)
# Dims of the draft cache's buffers [1, nkv, capacity, hd] that are fixed for a drafter (batch,
# KV heads, head size); only the capacity grows. See Drafter._pin_cache_shape.
CACHE_FIXED_DIMS = (0, 1, 3)


class Drafter:
    """Batch 1. Owns the draft's cache; `extend` after every verification, then `draft_tree`.

    The host tracks only how many cache rows are committed (known after every verification);
    each forward reads the committed count, root and positions from small device buffers. So on
    CUDA every extend of a few rows and every tree runs as one replayed CUDA graph per (rows,
    attended window) bucket; on CPU the same functions run eagerly (the path the tests pin).
    Sampled chains draw with a generator and always run eagerly.

    A launch-ahead loop (`engine.pipelined`) enqueues the next round before it knows how many
    drafts were accepted: `extend_verified` takes the accepted path from the device-side verdict
    and `draft_tree_at` the root from the device, so the host holds only bounds there.
    """

    def __init__(
        self,
        draft: Eagle3Draft,
        spec: SpecArgs,
        *,
        max_seq_len: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool | None = None,
    ) -> None:
        if spec.topk > draft.config.draft_vocab_size:
            raise ValueError(
                f"topk={spec.topk} exceeds the draft vocabulary ({draft.config.draft_vocab_size})"
            )
        draft.fuse_weights()  # stacked q/k/v and gate/up: no weight copy inside each forward
        self.draft = draft
        self.spec = spec
        self.device = next(draft.parameters()).device
        self.dtype = next(draft.parameters()).dtype
        self.vocab_size = draft.config.vocab_size
        # two Triton kernels per draft step on CUDA instead of ~10 (engine.top_k_cuda); chosen here,
        # outside the compiled round
        self._top_k_log_probs = top_k_log_probs_for(self.device)
        self.draft_to_target = cast(torch.Tensor, draft.draft_to_target)  # [Vd] absolute target ids
        self.tree_rows = spec.topk * (spec.num_steps - 1)  # provisional rows one round writes
        capacity = INITIAL_CACHE_ROWS if max_seq_len is None else max_seq_len + self.tree_rows
        cfg = draft.config
        self.cache = DraftCache(
            cfg.num_key_value_heads, cfg.head_dim, dtype=self.dtype, device=self.device, capacity=capacity
        )
        on_cuda = self.device.type == "cuda"
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        if self.use_graphs and not on_cuda:
            raise ConfigError("Drafter: cuda_graphs=True needs the draft on CUDA", fix="cuda_graphs=None")
        self._graphs = GraphCache(self.device) if self.use_graphs else None
        # the RoPE table moves to the device now, eagerly: a host-to-device copy cannot be captured
        draft.rope(torch.zeros(1, 1, dtype=torch.long, device=self.device), self.dtype)
        # Each draft forward is ~100 small kernels (norms, RoPE, masks, softmax); torch.compile fuses the
        # elementwise ones and the CUDA graph replays the fused kernels. On an H200 (SmolLM2-shaped
        # draft, benchmarks/draft_speed.py) a 5-step chain went 1.15 -> 0.82 ms, an extend 0.17 -> 0.09 ms.
        self.compiled = self.use_graphs if compile is None else compile
        self._pin_cache_shape()
        # a private code object per drafter: compiled entries are kept per code object, so drafters
        # sharing Eagle3Draft.forward's (a sweep builds one per setting) would pile up recompiles
        forward = types.MethodType(own_code(type(draft).forward), draft)
        self._forward = torch.compile(forward, dynamic=True) if self.compiled else draft.forward
        # A whole greedy/top-k round (forwards, top-k, beam, selection, ancestor mask) compiled as one
        # function: the masks and bookkeeping between the forwards fuse too. If it cannot be compiled
        # or captured, the round falls back to the compiled forward alone (`_capture_tree`).
        body = types.MethodType(own_code(Drafter._tree_body), self)
        self._tree_fn: Callable[..., tuple[torch.Tensor, ...]] = (
            torch.compile(body, dynamic=True) if self.compiled else self._tree_body
        )
        # Rows of a verified path: at most one per draft step plus the bonus, one graph per count.
        # Longer extends (the prompt) are padded to a power-of-two width, up to
        # graph_max_prefill_rows, and replay that width's graph; longer still run eagerly.
        self.graph_max_extend_rows = spec.num_steps + 1
        self.graph_max_prefill_rows = PREFILL_MAX_WIDTH
        self._slots = torch.arange(self.cache.capacity, device=self.device)  # [capacity]
        self._committed = torch.zeros(1, dtype=torch.long, device=self.device)  # device copy of `committed`
        self._root_token = torch.zeros(1, dtype=torch.long, device=self.device)
        self._root_position = torch.zeros(1, dtype=torch.long, device=self.device)
        self._accepted = torch.ones(1, dtype=torch.long, device=self.device)  # real rows of extend_verified
        # frontier row of each of the K*K children (built here: repeat_interleave may sync the host)
        self._beam_rows = torch.arange(spec.topk, device=self.device).repeat_interleave(spec.topk)
        self.committed = 0  # cache rows that belong to accepted tokens (a bound after extend_verified)
        self.last_hidden: torch.Tensor | None = None  # [1, 1, H] output of the last committed row
        self.last_logits: torch.Tensor | None = None  # [Vd] its logits

    def reset(self) -> None:
        self.committed = 0
        self.last_hidden = self.last_logits = None

    def reserve(self, max_seq_len: int) -> None:
        """Room for sequences of `max_seq_len` now, so that no later call grows the cache (and drops
        the captured graphs) while replays of them may still be queued on the device."""
        self._prepare(max_seq_len + self.tree_rows)

    @torch.no_grad()
    def extend(self, aux: torch.Tensor, tokens: torch.Tensor, start_position: int) -> None:
        """aux [n, A*Ht] target states at positions start..start+n-1; tokens [n] the tokens after them.
        Overwrites the last round's provisional tree rows."""
        if start_position != self.committed:
            raise ValueError(
                f"draft rows must be contiguous: next row is {self.committed}, got {start_position}"
            )
        n = tokens.shape[0]
        rows = self._extend_width(n)
        window = self._prepare(self.committed + rows)
        self._committed.fill_(self.committed)
        aux = aux.to(device=self.device, dtype=self.dtype)
        tokens = tokens.to(self.device, non_blocking=True)
        replayed = None
        if rows == n and n <= self.graph_max_extend_rows:
            width = aux.shape[-1]
            replayed = self._replay(
                ("extend", n, window),
                lambda: {
                    "aux": torch.zeros(n, width, dtype=self.dtype, device=self.device),
                    "tokens": torch.zeros(n, dtype=torch.long, device=self.device),
                },
                lambda inp: self._extend_rows(inp["aux"], inp["tokens"], window),
                {"aux": aux, "tokens": tokens},
            )
        elif rows > n:
            replayed = self._padded_extend(aux, tokens, rows, window)
        hidden, logits = replayed if replayed is not None else self._extend_rows(aux, tokens, window)
        self.committed += n
        self.last_hidden, self.last_logits = hidden, logits

    @torch.no_grad()
    def extend_verified(self, aux: torch.Tensor, verdict: DeviceVerdict, start_position: int) -> None:
        """`extend` by a verification's accepted rows while only the device knows how many: aux
        [N, A*Ht] the verify forward's states for its N nodes; verdict its greedy verdict (path and
        tokens in P slots, the first `count` real); start_position the round's root position.

        All P rows are fed (one graph per window serves every count) and the last real one gives
        the outputs; rows past it are provisional, like tree rows. Afterwards `committed` is only a
        host bound (start + P): the true count goes on in the next `DeviceRoot`."""
        if start_position > self.committed:
            raise ValueError(
                f"draft rows must be contiguous: at most {self.committed} rows are committed, "
                f"got start {start_position}"
            )
        P = verdict.path.shape[0]
        window = self._prepare(start_position + P)
        self._committed.fill_(start_position)
        self._accepted.copy_(verdict.count)
        aux = aux.to(device=self.device, dtype=self.dtype)
        N, width = aux.shape
        replayed = self._replay(
            ("extend_verified", N, P, window),
            lambda: {
                "aux": torch.zeros(N, width, dtype=self.dtype, device=self.device),
                "path": torch.zeros(P, dtype=torch.long, device=self.device),
                "tokens": torch.zeros(P, dtype=torch.long, device=self.device),
            },
            lambda inp: self._extend_path(inp["aux"], inp["path"], inp["tokens"], window),
            {"aux": aux, "path": verdict.path, "tokens": verdict.emitted},
        )
        if replayed is None:
            replayed = self._extend_path(aux, verdict.path, verdict.emitted, window)
        self.committed = start_position + P
        self.last_hidden, self.last_logits = replayed

    @torch.no_grad()
    def draft_tree(
        self,
        root_token: int,
        root_position: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        """The tree to verify next: root (not yet in the target cache) at `root_position` plus drafts.
        With CUDA graphs its tensors are graph buffers: valid until the next `draft_tree`."""
        if self.last_hidden is None or self.last_logits is None:
            return root_only(root_token, self.device)  # nothing to draft from yet (one-token prompt)
        window = self._prepare(self.committed + self.tree_rows)
        self._committed.fill_(self.committed)
        self._root_token.fill_(root_token)
        self._root_position.fill_(root_position)
        return self._draft(window, sampling, generator)

    @torch.no_grad()
    def draft_tree_at(self, root: DeviceRoot) -> DraftTree:
        """`draft_tree` (greedy: top-k candidates) from a root only the device knows yet; every
        accepted token before the root has its row, so the root's position is the committed count.
        Nothing is read from the host; the window comes from the root's position bound."""
        if self.last_hidden is None or self.last_logits is None:
            return root_only(root.token, self.device)
        window = self._prepare(root.position_bound + self.tree_rows)
        self._committed.copy_(root.position)
        self._root_token.copy_(root.token)
        self._root_position.copy_(root.position)
        return self._draft(window, TOP_K_ROUND, None)

    def _draft(self, window: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """A round from the published root and committed count: the graphed round, or eagerly."""
        assert self.last_hidden is not None and self.last_logits is not None
        replayed = None
        if not (self.spec.is_chain and not sampling.greedy):
            hidden_shape = tuple(self.last_hidden.shape)
            replayed = self._capture_tree(hidden_shape, window)
        if replayed is None:
            return self._draft_rows(self.last_hidden, self.last_logits, sampling, generator, window)
        tokens, parents, depths, scores, ancestors = replayed
        return DraftTree(
            tokens, parents, depths, depth_limit=self.spec.num_steps, scores=scores, ancestors=ancestors
        )

    def _capture_tree(self, hidden_shape: tuple[int, ...], window: int) -> tuple[torch.Tensor, ...] | None:
        """Replay this window's tree graph (capturing it first); None when graphs are off.

        Graphed rounds pick deterministic top-k candidates whatever the sampling settings (only
        sampled chains draw, and those run eagerly), so the round is built with TOP_K_ROUND: one
        graph per window serves every request, and the compiled round never sees a caller's object."""
        sampling = TOP_K_ROUND
        assert self.last_hidden is not None and self.last_logits is not None

        def make_inputs() -> dict[str, torch.Tensor]:
            return {
                "hidden": torch.zeros(hidden_shape, dtype=self.dtype, device=self.device),
                "logits": torch.zeros(self.draft_to_target.shape[0], device=self.device),
            }

        values = {"hidden": self.last_hidden, "logits": self.last_logits}
        if self._graphs is not None and self._tree_fn is not self._tree_body:
            try:
                return self._graphs.get(
                    ("tree", window),
                    make_inputs,
                    lambda inp: self._tree_fn(inp["hidden"], inp["logits"], sampling, window),
                ).run(values)
            except RuntimeError as err:  # torch.compile's errors are RuntimeErrors too
                log.warning("compiling the whole draft round failed (%s); compiling the forward only", err)
                self._tree_fn = self._tree_body
        return self._replay(
            ("tree", window),
            make_inputs,
            lambda inp: self._tree_body(inp["hidden"], inp["logits"], sampling, window),
            values,
        )

    def _tree_body(
        self, hidden: torch.Tensor, logits: torch.Tensor, sampling: SamplingParams, window: int
    ) -> tuple[torch.Tensor, ...]:
        return self._tree_tensors(self._draft_rows(hidden, logits, sampling, None, window))

    def _replay(
        self,
        key: tuple[object, ...],
        make_inputs: Callable[[], dict[str, torch.Tensor]],
        fn: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]],
        values: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, ...] | None:
        """Run `fn` as the CUDA graph for `key` (captured on first use); None when graphs are off.
        A capture that fails turns graphs off for this drafter, loudly, rather than failing decoding."""
        if self._graphs is None:
            return None
        try:
            graph = self._graphs.get(key, make_inputs, fn)
        except RuntimeError as err:
            log.warning(
                "draft CUDA graph %s could not be captured (%s); drafting eagerly from now on", key, err
            )
            self._graphs = None
            return None
        return graph.run(values)

    def _pin_cache_shape(self) -> None:
        """Tell torch.compile that the cache buffers' CACHE_FIXED_DIMS are constants.

        Both compiled functions use dynamic=True, so every size they read is a symbol unless marked.
        With a symbolic KV-head count, the attention's `enable_gqa=key.shape[1] != q.shape[1]` is a
        SymBool, which scaled_dot_product_attention rejects on torch 2.11 ("argument 'enable_gqa' must
        be bool, not SymBool"): a graph break in every draft forward. Inside the round's depth loop
        dynamo cannot resume from it, so it runs `_draft_rows` eagerly and compiles each call made
        there as its own frame: `CandidatePool.add` once per pool length, up to the recompile limit.
        Marked static, the count is an int and the round traces as one graph. The capacity stays
        symbolic, so a grown cache needs no recompile."""
        if not self.compiled:
            return
        for buffer in (self.cache.key, self.cache.value):  # [1, nkv, capacity, hd]
            torch._dynamo.mark_static(buffer, list(CACHE_FIXED_DIMS))  # a list: its stub takes int or list

    # -- device work (graph-capturable: no host reads, no allocation that depends on device values) --
    def _prepare(self, rows: int) -> int:
        """Room for `rows` cache rows; return the attended window (the caller publishes `_committed`)."""
        if self.cache.ensure(rows):
            self._pin_cache_shape()  # new buffers: mark them again
            self._slots = torch.arange(self.cache.capacity, device=self.device)
            if self._graphs is not None:
                self._graphs.clear()  # captured graphs point at the old buffers
        return kv_bucket(rows, self.cache.capacity)

    def _extend_width(self, n: int) -> int:
        """Rows an extend of n runs: n, or a prompt-long extend's padded width when graphs are on."""
        if self._graphs is None or n <= self.graph_max_extend_rows or n > self.graph_max_prefill_rows:
            return n
        return prefill_width(n)

    def _padded_extend(
        self, aux: torch.Tensor, tokens: torch.Tensor, rows: int, window: int
    ) -> tuple[torch.Tensor, ...] | None:
        """extend's n rows (aux [n, A*Ht], tokens [n]) run `rows` wide through that width's graph
        (None: graphs are off): zero rows after the real ones, which the causal mask keeps from the
        real rows and the next write overwrites (as a round's provisional tree rows); the outputs
        are row n-1's."""
        n, width = aux.shape
        padded_aux = torch.cat([aux, aux.new_zeros(rows - n, width)])  # [rows, A*Ht]
        padded_tokens = torch.cat([tokens, tokens.new_zeros(rows - n)])  # [rows]
        last = torch.full((1,), n - 1, dtype=torch.long, device=self.device)
        return self._replay(
            ("extend_padded", rows, window),
            lambda: {
                "aux": torch.zeros(rows, width, dtype=self.dtype, device=self.device),
                "tokens": torch.zeros(rows, dtype=torch.long, device=self.device),
                "last": torch.zeros(1, dtype=torch.long, device=self.device),
            },
            lambda inp: self._extend_rows(inp["aux"], inp["tokens"], window, last=inp["last"]),
            {"aux": padded_aux, "tokens": padded_tokens, "last": last},
        )

    def _extend_rows(
        self, aux: torch.Tensor, tokens: torch.Tensor, window: int, last: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Commit n rows at cache slots committed.. (a row's slot is its position) -> (hidden of the
        last row, or of row `last` [1] (device), [1, 1, H]; its logits [Vd] float32)."""
        n = tokens.shape[0]
        positions = self._committed + self._slots[:n]  # [n]
        self.cache.write(positions, window)
        mask = self._slots[:window][None, :] <= positions[:, None]  # [n, W] causal over committed rows
        hidden = self.draft.project(aux[None])  # [1, n, H]
        out = self._forward(
            tokens[None], hidden, positions[None], kv=self.cache, mask=mask, compute_logits=False
        )
        kept = out.hidden[:, -1:] if last is None else out.hidden.index_select(1, last)  # [1, 1, H]
        return kept, self.draft.compute_logits(kept)[0, 0].float()

    def _extend_path(
        self, aux: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, window: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """extend_verified's device work: aux [N, A*Ht] gathered along path [P], paired with tokens
        [P]; the outputs are row `_accepted` - 1's."""
        return self._extend_rows(aux.index_select(0, path), tokens, window, last=self._accepted - 1)

    def _draft_rows(
        self,
        last_hidden: torch.Tensor,
        last_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        window: int,
    ) -> DraftTree:
        """num_steps - 1 draft forwards of the beam, then EAGLE-2 selection (see the module doc)."""
        K = self.spec.topk
        pool = CandidatePool()
        ids, logp, q = self._children(last_logits[None], sampling, generator)  # [1, K] each
        tokens = self.draft_to_target[ids[0]]  # [K] target ids
        no_parent = torch.full((K,), -1, device=self.device)
        frontier = Frontier(
            index=pool.add(tokens, logp[0], no_parent, depth=1, q=q),
            scores=logp[0],
            tokens=tokens,
            hidden=last_hidden.expand(1, K, -1),  # depth-1 nodes continue the last committed row
            sees=torch.zeros(K, 0, dtype=torch.bool, device=self.device),
        )
        for depth in range(1, self.spec.num_steps):
            out, sees = self._feed(frontier, depth, window)
            ids, logp, q = self._children(out.logits[0], sampling, generator)  # [K, K] each
            scores = (frontier.scores[:, None] + logp).flatten()  # [K*K] cumulative log-probs
            tokens = self.draft_to_target[ids].flatten()  # [K*K]
            row = self._beam_rows  # [K*K] frontier row of each child
            index = pool.add(tokens, scores, frontier.index[row], depth=depth + 1, q=q)
            best = top_indices(scores, K)  # the next beam
            frontier = Frontier(
                index=index[best],
                scores=scores[best],
                tokens=tokens[best],
                hidden=out.hidden[:, row[best]],
                sees=sees[row[best]],
            )
        return self._select(pool)

    def _feed(self, frontier: Frontier, depth: int, window: int) -> tuple[DraftOutput, torch.Tensor]:
        """Run the frontier (nodes of depth `depth`) as K new rows after this round's R earlier tree
        rows; each sees the committed rows, its ancestors' rows and itself. Returns the output
        and the tree rows each new row sees [K, R+K]."""
        K, R = frontier.tokens.shape[0], frontier.sees.shape[1]
        sees = torch.cat([frontier.sees, torch.eye(K, dtype=torch.bool, device=self.device)], dim=1)
        self.cache.write(self._committed + R + self._slots[:K], window)
        tree_row = (
            self._slots[:window] - self._committed
        )  # [W] slot -> row of this round's tree (<0: committed)
        in_tree = (tree_row >= 0) & (tree_row < R + K)
        mask = (tree_row < 0)[None, :] | (sees[:, tree_row.clamp(0, R + K - 1)] & in_tree[None, :])  # [K, W]
        positions = (self._root_position + (depth - 1)).expand(1, K)  # [1, K]
        out = self._forward(frontier.tokens[None], frontier.hidden, positions, kv=self.cache, mask=mask)
        return out, sees

    def _select(self, pool: CandidatePool) -> DraftTree:
        """EAGLE-2 reranking: the best num_draft_tokens - 1 candidates, under the root."""
        scores = torch.cat(pool.scores)
        kept, parents = select_nodes(scores, torch.cat(pool.parents), self.spec.num_draft_tokens - 1)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        draft_probs = None
        if pool.q:  # a sampled chain: row 0 (the root) was not drafted
            no_q = torch.zeros(1, self.vocab_size, device=self.device)
            draft_probs = torch.cat([no_q, torch.cat(pool.q)[kept]])
        return DraftTree(
            tokens=torch.cat([self._root_token, torch.cat(pool.tokens)[kept]]),
            parents=parents,
            depths=torch.cat([zero, torch.cat(pool.depths)[kept]]),
            depth_limit=self.spec.num_steps,
            draft_probs=draft_probs,
            scores=torch.cat([zero.float(), scores[kept]]),
        )

    @staticmethod
    def _tree_tensors(tree: DraftTree) -> tuple[torch.Tensor, ...]:
        assert tree.scores is not None
        return tree.tokens, tree.parents, tree.depths, tree.scores, tree.ancestor_mask()

    def _children(
        self, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """logits [R, Vd] -> (draft ids [R, K], their log-probs [R, K], q [R, V] or None).

        Top-k by draft probability, except a sampled chain, which draws its one child from the
        processed draft distribution and returns that distribution (in target ids) as q.
        """
        if not (self.spec.is_chain and not sampling.greedy):
            ids, logp = self._top_k_log_probs(logits, self.spec.topk)
            return ids, logp, None
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        probs = probs_from_logits(logits, sampling)  # [R, Vd]
        ids = torch.multinomial(probs, 1, generator=generator)  # [R, 1]
        q = torch.zeros(logits.shape[0], self.vocab_size, device=self.device)
        q.index_add_(1, self.draft_to_target, probs)  # [R, V] draft distribution over target ids
        return ids, logp.gather(-1, ids), q
