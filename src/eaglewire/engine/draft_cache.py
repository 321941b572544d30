"""The draft layer's KV cache for serving: preallocated buffers written at device-side slots.

A committed prefix (the rows of accepted tokens), then provisional tree rows that the next extend
overwrites. Rows are written at slots given as a device tensor, so one captured CUDA graph serves
every cache length up to its window; the buffers grow only host-side, between forwards.
"""

from __future__ import annotations

import torch

from eaglewire.draft.model import attend

INITIAL_CACHE_ROWS = 256


class DraftCache:
    """The draft layer's keys/values in preallocated buffers: a committed prefix, then provisional
    tree rows. Rows are written at slots given as a device tensor (`write`), so one captured CUDA
    graph serves every cache length up to its window. `ensure` grows the buffers host-side, before
    a forward (never inside a graph), keeping what they hold."""

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        capacity: int = INITIAL_CACHE_ROWS,
    ) -> None:
        self.key = torch.zeros(1, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.value = torch.zeros_like(self.key)  # [1, nkv, capacity, hd]
        self._slots: torch.Tensor | None = None  # [T] where the next append's rows go
        self._window = 0  # keys the next append returns: slots 0 .. window-1

    @property
    def capacity(self) -> int:
        return int(self.key.shape[2])

    def ensure(self, rows: int) -> bool:
        """Room for `rows` slots; True when the buffers were reallocated (captured graphs are stale)."""
        if rows <= self.capacity:
            return False
        capacity = max(rows, 2 * self.capacity)
        old_key, old_value = self.key, self.value
        self.key = old_key.new_zeros(*old_key.shape[:2], capacity, old_key.shape[3])
        self.value = torch.zeros_like(self.key)
        self.key[:, :, : old_key.shape[2]] = old_key
        self.value[:, :, : old_value.shape[2]] = old_value
        return True

    def write(self, slots: torch.Tensor, window: int) -> None:
        """Set where the next `append` stores its rows ([T] slots) and how many slots it returns."""
        self._slots, self._window = slots, window

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new [1, nkv, T, hd] keys/values at the slots set by `write`; return the first
        `window` slots [1, nkv, W, hd] (the caller's mask hides those not meaningful yet)."""
        if self._slots is None:
            raise RuntimeError("DraftCache.append before write(): where the rows go is not set")
        self.key.index_copy_(2, self._slots, key)
        self.value.index_copy_(2, self._slots, value)
        return self.key[:, :, : self._window], self.value[:, :, : self._window]

    def attend(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return attend(q, *self.append(key, value), mask)
