"""How capture groups records into forwards (pure: no torch, so the CLI can show the defaults)."""

from __future__ import annotations

from collections.abc import Sequence

# A forward launches the same ~1,000 kernels whatever its batch holds, so small batches leave the
# GPU waiting on the host: on the H200 (BENCHMARKS.md section 3, 2026-12-01 profile) batches of 8
# chitchat records (~5.8k tokens) took 29 ms of host time against 14 ms of kernels. Batches are
# therefore bounded by tokens, not rows: a row cap high enough never to bind for chat-length records.
DEFAULT_BATCH_SIZE = 64
DEFAULT_MAX_BATCH_TOKENS = 32768


def length_batches(lengths: Sequence[int], batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Indices of `lengths` grouped longest-first so padding stays small: each group holds at most
    `batch_size` records and `max_batch_tokens` padded tokens (a record longer than that alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) >= batch_size or width * (len(cur) + 1) > max_batch_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


# capture_dataset captures consecutive shards together, a window at a time, about this many full
# batches' tokens each. Batched alone, 64-record shards of chitchat made 20 forwards and 448k padded
# tokens where the same 300k tokens batched together make 12 and 336k (BENCHMARKS.md section 3); a
# single window for everything would leave no shard writes to overlap the forwards.
WINDOW_BATCHES = 8

# Capture forwards the host may queue ahead of the GPU (`capture_batches.ForwardPacer` says why). H200 run
# 10 (BENCHMARKS.md section 3), 1M tokens end to end: 2.97 s at 2 and at 1, 3.24 s unbounded; 2
# keeps a forward queued behind the running one, so the GPU never waits for the host.
DEFAULT_PACE_BATCHES = 2

# Records per shard file. After the last forward, the last window's shards are still to be hashed and
# written, each by one thread, so the tail is about one shard's write; and each writer holds a whole
# shard in pinned host memory. H200 run 12 (BENCHMARKS.md section 3), 1M chitchat tokens: 32-record
# shards (~105 MB) 2.43 s end to end, drain 0.17-0.19 s, against 2.55 s and 0.27-0.31 s at 64 and
# 2.44 s at 16 (more files, no shorter tail). At 256 (the default before) one shard is ~850 MB: ~1 s
# of tail, and 8 writers' shards alone pin ~7 GB.
DEFAULT_SHARD_RECORDS = 32


def capture_windows(shard_tokens: Sequence[int], window_tokens: int) -> list[list[int]]:
    """Group shards (positions in `shard_tokens`, each shard's token count) into consecutive windows
    of whole shards, each closed as soon as it holds at least `window_tokens` tokens."""
    out: list[list[int]] = []
    cur: list[int] = []
    held = 0
    for k, tokens in enumerate(shard_tokens):
        cur.append(k)
        held += tokens
        if held >= window_tokens:
            out.append(cur)
            cur, held = [], 0
    if cur:
        out.append(cur)
    return out
