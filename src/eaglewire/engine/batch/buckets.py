"""Batch-size buckets and the row moves that shrink a batch into a smaller bucket (pure host math).

CUDA graphs are captured per batch size, so a batched decoder runs the smallest bucket that holds
its running rows: powers of two up to the largest batch, and the largest batch itself.
"""

from __future__ import annotations


def buckets(max_rows: int) -> list[int]:
    """[1, 2, 4, ..., max_rows]: powers of two below max_rows, then max_rows."""
    sizes = [1]
    while sizes[-1] * 2 < max_rows:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_rows:
        sizes.append(max_rows)
    return sizes


def bucket_for(rows: int, max_rows: int) -> int:
    """The smallest bucket that holds `rows` (at least 1) rows."""
    if rows > max_rows:
        raise ValueError(f"{rows} rows do not fit a batch of at most {max_rows}")
    return next(size for size in buckets(max_rows) if size >= max(rows, 1))


def compaction_moves(occupied: list[bool], bucket: int) -> list[tuple[int, int]]:
    """(src, dst) row moves that bring every occupied row below `bucket`: each occupied row at or
    past it goes to the lowest free row below it. Raises when more rows are occupied than fit."""
    free = [r for r in range(bucket) if not occupied[r]]
    outside = [r for r in range(bucket, len(occupied)) if occupied[r]]
    if len(outside) > len(free):
        raise ValueError(f"{sum(occupied)} occupied rows do not fit a bucket of {bucket}")
    return list(zip(outside, free, strict=False))
