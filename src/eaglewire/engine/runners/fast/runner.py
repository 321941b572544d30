"""FastTargetRunner: the compact Llama-family target with a static KV cache (a `TargetRunner`).

On CUDA every forward that extends a non-empty cache (decode, verification) replays a CUDA graph
captured for its (batch, new tokens, attended slots) bucket, around functions compiled by
torch.compile. A prefill of one empty row (a latency-bound request) is padded to a power-of-two
width and replays that width's graph too: eagerly, a 30-layer prefill of a 50-token prompt is
~400 kernel launches from Python (16-30 ms on an H200, as long as ~20 decode steps). Batched
prefills of empty rows run eagerly (compute-bound), attending among their own tokens only. On CPU
everything runs eagerly: that is the path the parity tests pin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from eaglewire.engine.fits import model_positions
from eaglewire.engine.runners.fast.graphs import GraphCache, own_code
from eaglewire.engine.runners.fast.greedy import tree_greedy_paths, with_greedy
from eaglewire.engine.runners.fast.kv_cache import PREFILL_MAX_WIDTH, StaticKVCache, kv_bucket, prefill_width
from eaglewire.engine.runners.fast.model import KernelChoices, make_head_fn, make_layer_fn, prepare
from eaglewire.engine.runners.fast.weights import check_fast_supported, extract_weights
from eaglewire.engine.runners.protocol import TargetForward, check_boundaries
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.nn.attention import varying_shape_attention
from eaglewire.target.loading import LoadedTarget

if TYPE_CHECKING:
    from eaglewire.engine.forced import ForcedAcceptance

log = logging.getLogger(__name__)


# Which dims of each compiled-function input are the batch (B), new tokens (N) and window (S) axes.
_DYNAMIC_DIMS: dict[str, tuple[tuple[str, int], ...]] = {
    "positions": (("B", 0), ("N", 1)),
    "lengths": (("B", 0),),
    "tree": (("B", 0), ("N", 1), ("N", 2)),
    "slots_s": (("S", 0),),
    "h": (("B", 0), ("N", 1)),
    "delta": (("B", 0), ("N", 1)),
    "cos": (("B", 0), ("N", 2)),
    "sin": (("B", 0), ("N", 2)),
    "rows": (("B", 0), ("N", 1)),
    "slots": (("B", 0), ("N", 1)),
    "mask": (("B", 0), ("N", 2), ("S", 3)),
}


def pad_prefill(
    input_ids: torch.Tensor, positions: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids, positions [B, N] -> [B, width]: token 0 at the positions after the last. Causal
    attention keeps the real tokens blind to the padding after them; its K/V land beyond the
    committed length, where the next forward overwrites them."""
    B, N = input_ids.shape
    extra = width - N
    ids = torch.cat([input_ids, input_ids.new_zeros(B, extra)], dim=1)  # [B, width]
    after = positions[:, -1:] + 1 + torch.arange(extra, device=positions.device)  # [B, width - N]
    return ids, torch.cat([positions, after], dim=1)


def _mark_dynamic(B: int, N: int, **tensors: torch.Tensor | None) -> None:
    """Compile the window (and batch/new-token axes beyond 1) symbolically from the first call, so
    a new bucket reuses the compiled code instead of compiling again (sizes 1 stay specialised)."""
    for name, t in tensors.items():
        if t is None:
            continue
        for axis, dim in _DYNAMIC_DIMS[name]:
            if axis == "S" or (axis == "B" and B > 1) or (axis == "N" and N > 1):
                torch._dynamo.maybe_mark_dynamic(t, dim)


class FastTargetRunner:
    """A `TargetRunner` for Llama/Mistral/Qwen2/Qwen3 targets.

    `forward` returns logits [B, N, V] float32 (or [B, 1, V] at `logits_at`) and aux [B, N, A*Ht];
    with `copy_outputs=False` on CUDA those are the graph's static buffers, overwritten by the
    next forward of the same bucket. Forwards of more than `graph_max_new_tokens` new tokens per
    row (chunked prefill) run without graphs, and so do prefills of one empty row longer than
    `graph_max_prefill_tokens` (0: no graphed prefill)."""

    def __init__(
        self,
        target: LoadedTarget,
        aux_boundaries: Sequence[int],
        *,
        max_batch_size: int,
        max_seq_len: int,
        dtype: torch.dtype | None = None,
        compile: bool | None = None,
        cuda_graphs: bool | None = None,
        copy_outputs: bool = True,
        graph_max_new_tokens: int = 128,
        graph_max_prefill_tokens: int = PREFILL_MAX_WIDTH,
        compile_options: dict[str, Any] | None = None,
        kernel_choices: KernelChoices | None = None,
    ) -> None:
        model = target.model
        check_fast_supported(model.config, max_seq_len)
        self.weights = extract_weights(model, dtype)
        spec = self.weights.spec
        self.spec = spec
        self.num_layers = spec.num_layers
        self.vocab_size = spec.vocab_size
        self.hidden_size = spec.hidden_size
        self.device = self.weights.embed.device
        self.dtype = self.weights.embed.dtype
        self.aux_boundaries = check_boundaries(aux_boundaries, spec.num_layers)
        self.eos_token_ids = target.eos_token_ids
        self.max_positions = model_positions(model.config)  # the model's; max_seq_len is the cache's
        self.copy_outputs = copy_outputs
        self.graph_max_new_tokens = graph_max_new_tokens
        self._warned_tree_widths: set[int] = set()  # widths of eager tree forwards already logged
        self.graph_max_prefill_tokens = graph_max_prefill_tokens
        self.cache = StaticKVCache(
            num_layers=spec.num_layers,
            max_batch_size=max_batch_size,
            num_kv_heads=spec.num_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=spec.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self._kv_layers = list(self.cache.kv.unbind(0))
        on_cuda = self.device.type == "cuda"
        self.compiled = on_cuda if compile is None else compile
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        if self.use_graphs and not on_cuda:
            raise ConfigError(
                "FastTargetRunner: cuda_graphs=True needs a CUDA target", fix="cuda_graphs=None"
            )
        self._eager: tuple[Callable[..., Any], ...] = (make_layer_fn(spec), make_head_fn(spec), prepare)
        self._compiled: tuple[Callable[..., Any], ...]
        self.kernel_choices = (kernel_choices or KernelChoices()).resolved(self.device)
        self._compiled = self._eager
        if self.compiled:
            opts = dict(compile_options or {})
            fns: tuple[Callable[..., Any], ...] = (
                make_layer_fn(spec, self.kernel_choices),
                make_head_fn(spec),
                prepare,
            )
            self._compiled = tuple(torch.compile(own_code(fn), fullgraph=True, options=opts) for fn in fns)
        self._kv_positions = torch.arange(self.cache.capacity, device=self.device)
        self._rows = torch.arange(max_batch_size, device=self.device)[:, None]
        self._graphs = GraphCache(self.device) if self.use_graphs else None
        self._last_num_new = 0
        self._last_window = 0
        # a benchmark instrument (`engine.forced`): greedy verification accepts recorded paths
        self.forced_acceptance: ForcedAcceptance | None = None
        self.reset(1)

    # -- TargetRunner ------------------------------------------------------------------------------
    def reset(self, batch_size: int) -> None:
        self.cache.reset(batch_size)
        self._last_num_new = 0
        self._last_window = 0

    @property
    def lengths(self) -> torch.Tensor:
        return self.cache.lengths

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.cache.max_batch_size

    @property
    def graph_stats(self) -> tuple[int, float]:
        """(CUDA graphs captured, seconds their captures took, compilation included) over this
        runner's life; (0, 0.0) without graphs."""
        if self._graphs is None:
            return 0, 0.0
        return self._graphs.captures, self._graphs.capture_seconds

    def reserve_verify_width(self, num_new_tokens: int) -> None:
        """A decoder verifies trees of `num_new_tokens` nodes: run forwards that wide through CUDA
        graphs and the compiled code too. A tree's width is fixed per setting (one graph per
        attended window), unlike a chunked prefill's, so it is worth a graph. Without this a
        256-node tree ran eagerly: 145 tok/s against 1,272 for 128 nodes (docs/history/benchmarks-log.md
        §2p)."""
        self.graph_max_new_tokens = max(self.graph_max_new_tokens, int(num_new_tokens))

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        *,
        logits_at: torch.Tensor | None = None,
        greedy: bool = False,
        length_bound: int | None = None,
        copy_outputs: bool | None = None,
    ) -> TargetForward:
        """input_ids, positions [B, N]; tree_mask [B, N, N] bool or None (causal); logits_at [B]
        (optional, additive to the protocol): logits only at that new-token index of each row,
        shape [B, 1, V]; greedy (additive too): also verify the tree greedily (`TargetForward.greedy`,
        inside the CUDA graph when one runs); length_bound (additive too): an upper bound on every
        row's committed length that the caller knows (a loop that reads verdicts a round late): it
        tightens the host's bound, which then picks the attended window alone (no host read of the
        lengths; the mask still reads them on the device). Never waits for the device then."""
        B, N = self._check_inputs(input_ids, positions, tree_mask, logits_at)
        if greedy and logits_at is not None:
            raise ConfigError("forward: greedy verification needs every node's logits; drop logits_at")
        need = self.cache.check_room(N, length_bound)
        self.cache.note_forward(N)
        self._last_num_new = N
        if tree_mask is None and self.cache.lengths_exact_zero():
            width = self._prefill_graph_width(B, N)
            if width is not None:
                try:
                    return self._padded_prefill(input_ids, positions, logits_at, width, greedy)
                except RuntimeError as err:  # a compile or capture failure: prefill eagerly, as before
                    log.warning(
                        "graphed prefill (width %d) failed (%s); prefills run eagerly from now on", width, err
                    )
                    self.graph_max_prefill_tokens = 0
            logits, aux = self._run(input_ids, positions, None, self.cache.lengths, None, logits_at)
            return with_greedy(logits, aux, input_ids, tree_mask, greedy)
        window = kv_bucket(need, self.cache.capacity)
        if window > self._last_window and self.use_graphs and length_bound is None:
            # a new bucket: tighten the host's bound once (one sync) so buckets stay small
            window = kv_bucket(self.cache.sync_lengths() + N, self.cache.capacity)
        self._last_window = window
        if self._graphs is not None and self.graph_max_new_tokens < N and tree_mask is not None:
            self._warn_eager_tree(N)
        if self._graphs is None or self.graph_max_new_tokens < N:
            logits, aux = self._run(
                input_ids, positions, tree_mask, self.cache.lengths, self._kv_positions[:window], logits_at
            )
            forced = self.forced_acceptance
            return with_greedy(logits, aux, input_ids, tree_mask, greedy, positions, forced)
        copy = self.copy_outputs if copy_outputs is None else copy_outputs
        return self._replay(input_ids, positions, tree_mask, logits_at, window, greedy, copy)

    @torch.no_grad()
    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        self.cache.commit(accepted, num_accepted, self._last_num_new)

    @torch.no_grad()
    def commit_prefix(self, num_accepted: torch.Tensor) -> None:
        """Keep the first num_accepted[b] tokens of the last forward (plain decoding, prefill): no
        copy. CPU counts keep the host's length bound exact."""
        self.cache.commit_prefix(num_accepted)

    # -- row subsets (continuous batching) ------------------------------------------------------
    def reset_rows(self, rows: list[int]) -> None:
        """Empty some rows of the current batch; the others keep their tokens."""
        self.cache.reset_rows(rows)

    @torch.no_grad()
    def prefill_rows(
        self, rows: list[int], input_ids: torch.Tensor, positions: torch.Tensor, logits_at: torch.Tensor
    ) -> TargetForward:
        """Prefill empty `rows` (k of them) with input_ids, positions [k, N] (right-padded) while the
        other rows keep their state; returns logits [k, 1, V] at `logits_at` [k] and aux [k, N, A*Ht].
        Attention stays among each row's new tokens (causal); nothing is committed (`commit_rows`)."""
        if not self.cache.rows_empty(rows):
            raise ConfigError(
                f"prefill_rows: rows {rows} are not all empty", fix="call reset_rows(rows) first"
            )
        k, N = input_ids.shape
        if positions.shape != (k, N) or logits_at.shape != (k,) or len(rows) != k:
            raise ConfigError(
                expected_actual(
                    "prefill_rows(rows [k], input_ids/positions [k, N], logits_at [k])",
                    f"k={len(rows)}",
                    f"{tuple(input_ids.shape)}, {tuple(positions.shape)}, {tuple(logits_at.shape)}",
                )
            )
        if self.cache.capacity < N:  # the rows are empty: only the new tokens need room
            raise ConfigError(
                f"prefill_rows: {N} tokens do not fit max_seq_len={self.max_seq_len} "
                f"(capacity {self.cache.capacity} slots)",
                fix="build the runner with a larger max_seq_len",
            )
        cache_rows = torch.tensor(rows, dtype=torch.long, device=self.device)
        zeros = torch.zeros(k, dtype=torch.long, device=self.device)
        logits, aux = self._run(input_ids, positions, None, zeros, None, logits_at, cache_rows=cache_rows)
        return TargetForward(logits=logits, aux=aux)

    def commit_rows(self, rows: list[int], counts: list[int]) -> None:
        """Keep the first counts[i] tokens `prefill_rows` wrote into rows[i]."""
        self.cache.advance_rows(rows, counts)

    def resize(self, batch_size: int) -> None:
        """Forward `batch_size` rows from now on; rows 0..min(old, new)-1 keep their tokens, added
        rows are empty (`StaticKVCache.resize`). CUDA graphs are per batch size, so a batched
        decoder moves between a few bucket sizes with this instead of resetting."""
        self.cache.resize(batch_size)

    def move_row(self, src: int, dst: int) -> None:
        """Move row `src` (its cache and length) into row `dst`, leaving `src` empty."""
        self.cache.move_row(src, dst)

    def sync_lengths(self) -> torch.Tensor:
        """Read lengths to the host (one sync) and tighten the attended window; returns [B] (CPU)."""
        self.cache.sync_lengths()
        return self.cache.lengths.to("cpu")

    # -- internals ---------------------------------------------------------------------------------
    def _warn_eager_tree(self, N: int) -> None:
        if N not in self._warned_tree_widths:
            self._warned_tree_widths.add(N)
            log.warning(
                "a tree forward of %d new tokens runs without CUDA graphs (graph_max_new_tokens=%d), "
                "several times slower; call runner.reserve_verify_width(%d) first "
                "(speculative_generate does it for its drafter's setting)",
                N,
                self.graph_max_new_tokens,
                N,
            )

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None,
        logits_at: torch.Tensor | None,
    ) -> tuple[int, int]:
        if input_ids.dim() != 2 or input_ids.shape[0] != self.cache.batch_size:
            raise ConfigError(
                expected_actual(
                    "forward input_ids", f"[B={self.cache.batch_size}, N]", tuple(input_ids.shape)
                ),
                fix="call reset(batch_size) with the batch size you forward",
            )
        B, N = input_ids.shape
        if positions.shape != (B, N):
            raise ConfigError(expected_actual("forward positions", f"[{B}, {N}]", tuple(positions.shape)))
        if tree_mask is not None and tree_mask.shape != (B, N, N):
            raise ConfigError(
                expected_actual("forward tree_mask", f"[{B}, {N}, {N}]", tuple(tree_mask.shape))
            )
        if logits_at is not None and logits_at.shape != (B,):
            raise ConfigError(expected_actual("forward logits_at", f"[{B}]", tuple(logits_at.shape)))
        return B, N

    def _prefill_graph_width(self, B: int, N: int) -> int | None:
        """The padded width a prefill of B empty rows of N tokens replays a graph at; None: eager."""
        if self._graphs is None or B != 1 or self.graph_max_prefill_tokens < N:
            return None
        width = prefill_width(N)
        return width if width <= self.cache.capacity else None

    def _padded_prefill(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_at: torch.Tensor | None,
        width: int,
        greedy: bool,
    ) -> TargetForward:
        """A prefill of empty rows run `width` tokens wide through the bounded-window forward (its
        CUDA graph when graphs are on); logits and aux of the N real tokens, as the eager prefill."""
        N = input_ids.shape[1]
        ids, pos = pad_prefill(input_ids.to(self.device), positions.to(self.device), width)  # [B, width]
        window = kv_bucket(width, self.cache.capacity)
        if self._graphs is not None:
            fwd = self._replay(ids, pos, None, logits_at, window, False, self.copy_outputs)
            logits, aux = fwd.logits, fwd.aux
        else:  # the same arithmetic eagerly (the CPU tests pin the padding with it)
            kv = self._kv_positions[:window]
            logits, aux = self._run(ids, pos, None, self.cache.lengths, kv, logits_at)
        if logits_at is None:
            logits = logits[:, :N]  # [B, N, V]
        return with_greedy(logits, aux[:, :N], input_ids, None, greedy)

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None,
        lengths: torch.Tensor,
        kv_positions: torch.Tensor | None,
        logits_at: torch.Tensor | None,
        cache_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole forward as device work only (graph-capturable). cache_rows [B]: the cache rows
        the batch's rows write to (only for a prefill of empty rows, kv_positions None); default 0..B-1."""
        dev = self.device
        input_ids = input_ids.to(dev, non_blocking=True)
        positions = positions.to(dev, non_blocking=True)
        if tree_mask is not None:
            tree_mask = tree_mask.to(dev, non_blocking=True)
        if logits_at is not None:
            logits_at = logits_at.to(dev, torch.long, non_blocking=True)
        w = self.weights
        B, N = input_ids.shape
        # compiled code serves the bounded-window forwards (decode, verification); prefill and
        # wide chunks run eagerly (compute-bound; not worth a compile per shape)
        compiled = kv_positions is not None and self.graph_max_new_tokens >= N
        layer_fn, head_fn, prepare_fn = self._compiled if compiled else self._eager
        h = F.embedding(input_ids, w.embed)  # [B, N, Ht]
        delta = torch.zeros_like(h)
        if compiled and self.compiled:
            _mark_dynamic(B, N, positions=positions, lengths=lengths, tree=tree_mask, slots_s=kv_positions)
        cos, sin, slots, mask = prepare_fn(
            positions,
            lengths,
            tree_mask,
            kv_positions,
            w.rope_inv_freq,
            w.rope_scaling,
            self.spec.group_size,
            self.dtype,
        )
        if cache_rows is not None and kv_positions is not None:
            raise ConfigError(
                "cache_rows: only a prefill of empty rows (no attended cache) can pick its rows"
            )
        rows = (self._rows[:B] if cache_rows is None else cache_rows[:, None]).expand(B, N)
        if compiled and self.compiled:
            _mark_dynamic(B, N, h=h, delta=delta, cos=cos, sin=sin, rows=rows, slots=slots, mask=mask)
        wanted = set(self.aux_boundaries)
        states: dict[int, torch.Tensor] = {}
        # eager forwards (prefills, wide chunks) have a new shape nearly every call
        with nullcontext() if compiled else varying_shape_attention():
            for i, layer_w in enumerate(w.layers):
                x, h, delta = layer_fn(h, delta, *layer_w, self._kv_layers[i], cos, sin, rows, slots, mask)
                if i in wanted:
                    states[i] = x
        final, logits = head_fn(h, delta, w.final_norm, w.lm_head, logits_at)
        L = self.num_layers
        parts = [states[b] if b < L else final for b in self.aux_boundaries]
        aux = torch.cat(parts, dim=-1) if parts else final.new_zeros(B, N, 0)  # [B, N, A*Ht]
        return logits, aux

    def _replay(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None,
        logits_at: torch.Tensor | None,
        window: int,
        greedy: bool,
        copy_outputs: bool,
    ) -> TargetForward:
        assert self._graphs is not None
        B, N = input_ids.shape
        dev = self.device
        has_tree, has_at = tree_mask is not None, logits_at is not None
        forced = self.forced_acceptance if greedy else None
        key = (B, N, window, has_tree, has_at, greedy, None if forced is None else id(forced))

        def make_inputs() -> dict[str, torch.Tensor]:
            inputs = {
                "input_ids": torch.zeros(B, N, dtype=torch.long, device=dev),
                "positions": torch.zeros(B, N, dtype=torch.long, device=dev),
            }
            if has_tree:
                inputs["tree_mask"] = torch.ones(B, N, N, dtype=torch.bool, device=dev).tril()
            if has_at:
                inputs["logits_at"] = torch.zeros(B, dtype=torch.long, device=dev)
            return inputs

        def fn(inp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            logits, aux = self._run(
                inp["input_ids"],
                inp["positions"],
                inp.get("tree_mask"),
                self.cache.length_buffer[:B],
                self._kv_positions[:window],
                inp.get("logits_at"),
            )
            if not greedy:
                return logits, aux
            paths = tree_greedy_paths(
                inp["input_ids"], inp.get("tree_mask"), logits, inp["positions"], forced
            )
            return logits, aux, paths

        graph = self._graphs.get(key, make_inputs, fn)
        values = {"input_ids": input_ids, "positions": positions}
        if tree_mask is not None:
            values["tree_mask"] = tree_mask
        if logits_at is not None:
            values["logits_at"] = logits_at
        logits, aux, *paths = graph.run(values)
        if copy_outputs:
            logits, aux, paths = logits.clone(), aux.clone(), [p.clone() for p in paths]
        return TargetForward(logits=logits, aux=aux, greedy=paths[0] if paths else None)
