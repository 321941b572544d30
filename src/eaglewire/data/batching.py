"""How capture groups records into forwards (pure: no torch, so the CLI can show the defaults)."""

from __future__ import annotations

from collections.abc import Sequence

# A forward launches the same ~1,000 kernels whatever its batch holds, so small batches leave the
# GPU waiting on the host: on an H200 batches of 8 chitchat records (~5.8k tokens) took 29 ms of host
# time against 14 ms of kernels (docs/history/benchmarks-log.md §3, "benchmarks-log" below). Batches
# are therefore bounded by tokens, not rows: a row cap high enough never to bind for chat-length records.
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


# capture_dataset captures consecutive shards together, a window at a time, of at least WINDOW_BATCHES
# full batches' tokens. Batched alone, 64-record shards of chitchat made 20 forwards and 448k padded
# tokens where the same 300k tokens batched together make 12 and 336k (benchmarks-log §3); a
# single window for everything would leave no shard writes to overlap the forwards.
WINDOW_BATCHES = 8

# ... and of at most MAX_WINDOW_BATCHES: in between, a window takes half the tokens still to capture.
# A window's shards are written while the next window is captured, and the H200's writers are about
# twice as fast as its capture (4.3 GB/s of shards against ~2 GB/s of states, benchmarks-log §3),
# so each window may be half the one before and its writes still finish under the next one's
# forwards. Larger windows sort more records by length: on the 1M chitchat tokens of the capture
# benchmark, 32-record shards make 41 forwards and 1.105M padded tokens (windows of 512k, 302k and
# 185k tokens) against 43 and 1.136M with windows of 8 batches. On the H200 (benchmarks-log §3),
# interleaved: 2.37-2.45 s end to end (median 2.38, 0.73 of the prefill) against 2.42-2.60 s
# (2.45, 0.71) with every window at the floor; the drain stayed 0.17-0.22 s. The ceiling bounds the
# host memory a window holds (~2.4 GB at 16 batches of 32,768 tokens of SmolLM2's states).
MAX_WINDOW_BATCHES = 16

# Capture forwards the host may queue ahead of the GPU (`capture_batches.ForwardPacer` says why). On the
# H200 (benchmarks-log §3), 1M tokens end to end: 2.97 s at 2 and at 1, 3.24 s unbounded; 2
# keeps a forward queued behind the running one, so the GPU never waits for the host.
DEFAULT_PACE_BATCHES = 2

# Records per shard file. After the last forward, the last window's shards are still to be hashed and
# written, each by one thread, so the tail is about one shard's write; and each writer holds a whole
# shard in pinned host memory. On the H200 (benchmarks-log §3), 1M chitchat tokens: 32-record
# shards (~105 MB) 2.43 s end to end, drain 0.17-0.19 s, against 2.55 s and 0.27-0.31 s at 64 and
# 2.44 s at 16 (more files, no shorter tail). At 256 one shard is ~850 MB: ~1 s
# of tail, and 8 writers' shards alone pin ~7 GB.
DEFAULT_SHARD_RECORDS = 32


def capture_windows(
    shard_tokens: Sequence[int],
    window_tokens: int,
    max_window_tokens: int | None = None,
    last_window_shards: int | None = None,
) -> list[list[int]]:
    """Group shards (positions in `shard_tokens`, each shard's token count) into consecutive windows
    of whole shards. Each window closes as soon as it holds half the tokens not yet in a window,
    but at least `window_tokens` and at most `max_window_tokens` (None: `window_tokens`, i.e. every
    window closes at `window_tokens`). The last window holds at most `last_window_shards` shards
    (None: any number), the rest going to the window before: after the last forward only its shards
    are left to write, one per writer thread."""
    ceiling = window_tokens if max_window_tokens is None else max(window_tokens, max_window_tokens)
    out: list[list[int]] = []
    cur: list[int] = []
    held = 0
    left = sum(shard_tokens)
    for k, tokens in enumerate(shard_tokens):
        cur.append(k)
        held += tokens
        if held >= min(ceiling, max(window_tokens, left / 2)):
            out.append(cur)
            left -= held
            cur, held = [], 0
    if cur:
        out.append(cur)
    if last_window_shards is not None and len(out) > 1 and len(out[-1]) > last_window_shards:
        cut = len(out[-1]) - last_window_shards
        out[-2].extend(out[-1][:cut])
        out[-1] = out[-1][cut:]
    return out
