"""Preallocated static KV cache with per-row lengths, provisional writes and in-place compaction.

Layout: one tensor [L, Bmax, 2*Hkv, Smax, hd] (each layer's keys in heads 0..Hkv-1, its values in
heads Hkv..2Hkv-1, so one scatter stores both), allocated once (zeros, so masked-out slots never
hold NaN). A forward writes its N new tokens at slots
lengths[b] .. lengths[b]+N-1 of row b (provisionally); `commit` gathers the accepted ones, in
path order, to lengths[b] .. lengths[b]+n-1 for every layer at once, then advances `lengths`.
Everything stays on the device: no host synchronisation.

The host keeps an upper bound of each row's length (exact after `sync_lengths`, or when the
accepted counts are given as CPU tensors, or tightened by a bound the caller knows) to pick how
many cache slots a forward attends to and to check capacity without reading the device.
"""

from __future__ import annotations

import torch

from eaglewire.errors import ConfigError, expected_actual

SLOT_ALIGN = 64  # cache length and attention windows are multiples of this (kernel alignment)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def kv_bucket(needed: int, capacity: int) -> int:
    """Slots a forward attends to when it needs `needed`: coarse buckets bound how many CUDA graphs
    exist while wasting little attention work (64-slot steps to 512, 256 to 4096, then 1024)."""
    step = SLOT_ALIGN if needed <= 512 else 256 if needed <= 4096 else 1024
    return min(capacity, round_up(max(needed, 1), step))


PREFILL_MIN_WIDTH = 16  # the narrowest padded prefill (fewer graphs for the many short prompts)
PREFILL_MAX_WIDTH = 512  # the widest graphed prefill (target and draft); longer prompts run eagerly


def prefill_width(num_tokens: int) -> int:
    """The padded width of a graphed prefill (target or draft) of `num_tokens`: the next power of
    two, at least PREFILL_MIN_WIDTH (so ~log2(max) graphs, and at most 2x the tokens' work)."""
    return max(PREFILL_MIN_WIDTH, 1 << max(num_tokens - 1, 0).bit_length())


class StaticKVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        max_batch_size: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if max_batch_size < 1 or max_seq_len < 1:
            raise ConfigError(
                f"StaticKVCache: max_batch_size={max_batch_size} and max_seq_len={max_seq_len} must be >= 1"
            )
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.capacity = round_up(max_seq_len, SLOT_ALIGN)
        shape = (num_layers, max_batch_size, 2 * num_kv_heads, self.capacity, head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device
        self._lengths = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.batch_size = 0
        self._upper = torch.zeros(0, dtype=torch.long)  # CPU upper bound per row
        self._last_num_new = 0

    # -- rows ------------------------------------------------------------------------------------
    def reset(self, batch_size: int) -> None:
        if not 1 <= batch_size <= self.max_batch_size:
            raise ConfigError(
                expected_actual("reset(batch_size)", f"1..max_batch_size={self.max_batch_size}", batch_size),
                fix="build the runner with a larger max_batch_size",
            )
        self.batch_size = batch_size
        self._lengths.zero_()
        self._upper = torch.zeros(batch_size, dtype=torch.long)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] committed tokens per row (a view of the device buffer; do not modify)."""
        return self._lengths[: self.batch_size]

    @property
    def length_buffer(self) -> torch.Tensor:
        """The static [Bmax] device buffer CUDA graphs read."""
        return self._lengths

    def max_length_upper(self) -> int:
        return int(self._upper.max()) if self._upper.numel() else 0

    def lengths_exact_zero(self) -> bool:
        """True when every row is certainly empty (known on the host, no sync)."""
        return self.max_length_upper() == 0

    def sync_lengths(self) -> int:
        """Read the device lengths (one host sync) to make the host bound exact; returns the max."""
        self._upper = self.lengths.to("cpu")
        return self.max_length_upper()

    def check_room(self, num_new: int, length_bound: int | None = None) -> int:
        """Raise when `num_new` more tokens may not fit; returns max(lengths)+num_new (a bound).
        length_bound: the caller's own upper bound on every row's length, which tightens the host's."""
        if length_bound is not None:
            self._upper = self._upper.clamp(max=length_bound)
        need = self.max_length_upper() + num_new
        if need > self.capacity:
            need = self.sync_lengths() + num_new
        if need > self.capacity:
            raise ConfigError(
                f"KV cache full: a row holds {need - num_new} tokens and {num_new} more do not fit in "
                f"max_seq_len={self.max_seq_len} (capacity {self.capacity} slots)",
                fix="build the runner with a larger max_seq_len, or generate fewer tokens",
            )
        return need

    # -- commit ----------------------------------------------------------------------------------
    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor, num_new: int) -> None:
        """accepted [B, n] indices into the last forward's `num_new` tokens, in path order;
        num_accepted [B]. Moves those K/V (all layers) to lengths..lengths+n-1; advances lengths."""
        B, n = accepted.shape
        if self.batch_size != B or num_accepted.shape != (B,):
            raise ConfigError(
                expected_actual(
                    "commit(accepted [B, n], num_accepted [B]) shapes",
                    f"B={self.batch_size}",
                    f"{tuple(accepted.shape)}, {tuple(num_accepted.shape)}",
                )
            )
        if n > num_new:
            raise ConfigError(expected_actual("commit: accepted columns", f"<= {num_new} new tokens", n))
        dev = self.device
        accepted = accepted.to(dev, torch.long, non_blocking=True)
        if n > 0:
            base = self.lengths[:, None]  # [B, 1]
            src = base + accepted.clamp(0, num_new - 1)  # [B, n]
            dst = base + torch.arange(n, device=dev)  # [B, n]
            rows = torch.arange(B, device=dev)[:, None].expand(B, n)
            moved = self.kv[:, rows, :, src]  # [B, n, L, 2Hkv, hd]
            self.kv[:, rows, :, dst] = moved
        self._advance(num_accepted, n)

    def commit_prefix(self, num_accepted: torch.Tensor) -> None:
        """Keep the first num_accepted[b] new tokens of each row where they are (no copy)."""
        self._advance(num_accepted, self._last_num_new)

    def _advance(self, num_accepted: torch.Tensor, bound: int) -> None:
        """lengths += num_accepted; the host bound grows exactly (CPU counts) or by `bound`."""
        if (
            num_accepted.device.type == "cpu"
            and num_accepted.numel()
            and bool((num_accepted == num_accepted[0]).all())
        ):
            # one scalar add: a copy from pageable host memory would wait for the GPU to drain
            self.lengths.add_(int(num_accepted[0]))
        else:
            self.lengths.add_(num_accepted.to(self.device, torch.long, non_blocking=True))
        if num_accepted.device.type == "cpu":
            self._upper = self._upper + num_accepted.to(torch.long)
        else:
            self._upper = self._upper + bound

    def reset_rows(self, rows: list[int]) -> None:
        """Empty some rows (the others keep their tokens): continuous batching reuses a finished row."""
        self._check_rows(rows)
        idx = torch.tensor(rows, dtype=torch.long)
        self._lengths[idx.to(self.device)] = 0
        self._upper[idx] = 0

    def advance_rows(self, rows: list[int], counts: list[int]) -> None:
        """lengths[rows] += counts: keep the first counts[i] tokens a row-subset prefill wrote."""
        self._check_rows(rows)
        idx = torch.tensor(rows, dtype=torch.long)
        add = torch.tensor(counts, dtype=torch.long)
        self._lengths[idx.to(self.device)] += add.to(self.device)
        self._upper[idx] += add

    def resize(self, batch_size: int) -> None:
        """Serve `batch_size` rows from now on, keeping rows 0..min(old, new)-1 as they are; rows
        added are empty (a batched decoder grows and shrinks its batch-size bucket with this)."""
        if not 1 <= batch_size <= self.max_batch_size:
            raise ConfigError(
                expected_actual("resize(batch_size)", f"1..max_batch_size={self.max_batch_size}", batch_size),
                fix="build the runner with a larger max_batch_size",
            )
        old = self.batch_size
        if batch_size > old:
            self._lengths[old:batch_size] = 0
            self._upper = torch.cat([self._upper, torch.zeros(batch_size - old, dtype=torch.long)])
        else:
            self._upper = self._upper[:batch_size].clone()
        self.batch_size = batch_size

    def move_row(self, src: int, dst: int) -> None:
        """Row `src`'s tokens (every layer) and length into row `dst`; `src` becomes empty."""
        self._check_rows([src, dst])
        self.kv[:, dst] = self.kv[:, src]
        self._lengths[dst] = self._lengths[src]
        self._lengths[src] = 0
        self._upper[dst] = self._upper[src]
        self._upper[src] = 0

    def rows_empty(self, rows: list[int]) -> bool:
        """True when every row in `rows` is certainly empty (known on the host)."""
        return bool((self._upper[torch.tensor(rows, dtype=torch.long)] == 0).all())

    def _check_rows(self, rows: list[int]) -> None:
        bad = [r for r in rows if not 0 <= r < self.batch_size]
        if bad or len(set(rows)) != len(rows):
            raise ConfigError(
                expected_actual("rows", f"distinct rows in 0..{self.batch_size - 1}", rows),
                fix="pass rows of the current batch (reset(batch_size) sets it)",
            )

    def note_forward(self, num_new: int) -> None:
        """Remember the last forward's width (bounds a device-side commit_prefix)."""
        self._last_num_new = num_new
