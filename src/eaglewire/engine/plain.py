"""Plain (non-speculative) decoding on a target runner: batch 1 or batched, greedy or sampled.

    tokens = generate_plain(target_or_runner, prompts, max_new_tokens=256)      # list[list[int]]
    result = generate_plain_with_stats(...)   # + prefill/decode seconds, tokens/s

Prompts of different lengths share a batch: they are right-padded, prefilled (in chunks when the
batch is large) with each row's logits taken at its own last prompt token, then every row decodes
at its own positions. Rows that finished keep stepping (their extra tokens are dropped), so the
loop reads the device only every `check_every` steps to see whether every row is done.
The returned tokens are the generated ones only (no prompt), ending with the eos token when one
was produced. Data regeneration calls this with up to 256 prompts per batch.

A runner with CUDA graphs captures one graph per (batch rows, new tokens, attended window) key, so
on such a runner every batch is padded up to one of a few row counts (`padded_rows`) with dummy rows
(copies of the batch's shortest prompt) whose outputs are dropped: later batches and later calls
replay the graphs already captured instead of capturing new ones for every distinct batch size.
Rows never see each other (each attends to its own cache only) and only the real rows are sampled,
so padding changes no real row's tokens, greedy or sampled (beyond the floating-point differences
any change of batch size can bring on a GPU). Runners without graphs run unpadded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from eaglewire.engine.continuous import generate_continuous, supports_continuous
from eaglewire.engine.plain_parts import PREFILL_TOKEN_BUDGET, PlainResult, right_padded, sample_next
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.runners.protocol import commit_leading
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

# A batch's prompts are right-padded to its longest; a prompt shorter than longest / PAD_RATIO starts a
# new batch, so one long outlier cannot multiply the prefill cost of a whole batch.
PAD_RATIO = 2.0
DEFAULT_MAX_BATCH = 256
# Row counts a batch is padded to on a CUDA-graph runner (`padded_rows`): batches of up to 8 rows
# pad to the next of GRAPH_SMALL_ROWS, larger ones to the next multiple of GRAPH_ROW_STEP (both capped
# at the runner's max_batch_size), so a whole regeneration captures graphs for a handful of sizes.
GRAPH_SMALL_ROWS = (1, 2, 4, 8)
GRAPH_ROW_STEP = 64


def padded_rows(n: int, max_rows: int) -> int:
    """The row count a batch of `n` real rows runs with on a CUDA-graph runner holding `max_rows`:
    the next of GRAPH_SMALL_ROWS for n <= 8, else the next multiple of GRAPH_ROW_STEP; never above
    max_rows (and never below n)."""
    if not 1 <= n <= max_rows:
        raise ConfigError(f"padded_rows: expected 1 <= n <= max_rows={max_rows}, got n={n}")
    if n <= GRAPH_SMALL_ROWS[-1]:
        rows = next(r for r in GRAPH_SMALL_ROWS if r >= n)
    else:
        rows = -(-n // GRAPH_ROW_STEP) * GRAPH_ROW_STEP
    return min(rows, max_rows)


def _graph_stats(runner: Any) -> tuple[int, float]:
    """(graphs captured, seconds spent capturing) so far by `runner`; (0, 0.0) without graphs."""
    stats = getattr(runner, "graph_stats", None)
    return (int(stats[0]), float(stats[1])) if stats is not None else (0, 0.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefill(runner: Any, prompts: list[list[int]], budget: int) -> torch.Tensor:
    """Prefill right-padded prompts; returns each row's logits at its last prompt token [B, V]."""
    dev = runner.device
    ids, lens = right_padded(prompts)
    B, T = ids.shape
    width = T if budget >= B * T else max(16, budget // B)
    last: torch.Tensor | None = None
    for c0 in range(0, T, width):
        c1 = min(T, c0 + width)
        n = c1 - c0
        pos = (c0 + torch.arange(n)).expand(B, n)
        at = (lens - 1 - c0).clamp(0, n - 1)
        out = runner.forward(ids[:, c0:c1].to(dev), pos.to(dev), logits_at=at.to(dev))
        here = ((lens - 1 >= c0) & (lens - 1 < c1)).to(dev)[:, None]  # [B, 1]
        logits = out.logits[:, 0]  # [B, V]
        last = logits if last is None else torch.where(here, logits, last)
        commit_leading(runner, (lens - c0).clamp(0, n), n)
    assert last is not None
    return last


def _trim(row: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


def _generate_batch(
    runner: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    eos: tuple[int, ...],
    check_every: int,
    rows: int | None = None,
) -> tuple[list[list[int]], float, float, int]:
    """Decode one batch of n prompts; returns (n generated rows, prefill s, decode s, decode forwards).

    rows: the batch size the runner runs (>= n; None = n). The extra rows are copies of the shortest
    prompt: they step along with the real rows, are fed token 0 after the prefill, are never sampled
    (so the generator draws exactly what an unpadded batch draws) and their outputs are dropped."""
    dev = runner.device
    n = len(prompts)
    total = n if rows is None else rows  # B, padding rows included
    if total < n:
        raise ConfigError(f"_generate_batch: rows={total} is fewer than the {n} prompts")
    if total > n:
        prompts = prompts + [min(prompts, key=len)] * (total - n)
    runner.reset(total)
    _sync(dev)
    t0 = time.perf_counter()
    logits = _prefill(runner, prompts, PREFILL_TOKEN_BUDGET)  # [B, V]
    tok = sample_next(logits[:n], temperature, top_p, generator)  # [n]
    _sync(dev)
    t1 = time.perf_counter()
    out = torch.empty(n, max_new_tokens, dtype=torch.long, device=dev)
    eos_t = torch.tensor(eos, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    ones = torch.ones(total, dtype=torch.long)
    feed = torch.zeros(total, 1, dtype=torch.long, device=dev)  # [B, 1] real tokens, then padding rows' 0
    steps = 0
    for step in range(max_new_tokens):
        out[:, step] = tok
        steps = step + 1
        if eos:
            done |= torch.isin(tok, eos_t)
        if step == max_new_tokens - 1 or (eos and steps % check_every == 0 and bool(done.all())):
            break
        if total == n:
            feed = tok[:, None]
        else:
            feed[:n, 0] = tok
        o = runner.forward(feed, runner.lengths[:, None])
        commit_leading(runner, ones, 1)
        tok = sample_next(o.logits[:n, 0], temperature, top_p, generator)
    generated = out[:, :steps].tolist()
    _sync(dev)
    t2 = time.perf_counter()
    eos_set = set(eos)
    return [_trim(r, eos_set) for r in generated], t1 - t0, t2 - t1, steps - 1


def _as_runner(
    runner_or_target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, max_batch_size: int
) -> Any:
    if not isinstance(runner_or_target, LoadedTarget):
        return runner_or_target
    longest = max(len(p) for p in prompts)
    return make_runner(
        runner_or_target,
        (),
        max_batch_size=min(max_batch_size, len(prompts)),
        max_seq_len=longest + max_new_tokens,
    )


def length_buckets(order: Sequence[int], lengths: Sequence[int], max_rows: int) -> list[list[int]]:
    """Split `order` (longest first) into batches of at most `max_rows` rows whose shortest prompt is
    at least 1/PAD_RATIO of their longest."""
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) >= max_rows or lengths[i] * PAD_RATIO < lengths[batches[-1][0]]:
            batches.append([i])
        else:
            batches[-1].append(i)
    return batches


def generate_plain_with_stats(
    runner_or_target: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH,
    check_every: int = 16,
    pad_rows: bool | None = None,
    continuous: bool = False,
) -> PlainResult:
    """Decode every prompt (token ids) up to `max_new_tokens` new tokens or an eos.

    runner_or_target: a TargetRunner (FastTargetRunner/RecomputeRunner; its max_batch_size and
    max_seq_len bound the batches) or a LoadedTarget (a runner is built for these prompts).
    eos_token_ids: None = the runner's/target's own eos ids; () = never stop early.
    Prompts are batched longest first, `max_batch_size` (or the runner's) at a time.
    pad_rows: run each batch padded to `padded_rows` rows (None = when the runner uses CUDA graphs);
    padding changes no real row's tokens. The result's counts cover the real prompts only.
    continuous: refill rows as they finish (`eaglewire.engine.continuous`) instead of running
    batches to their last row, where the runner supports it (greedy tokens are the same)."""
    if not prompts:
        return PlainResult([], 0, 0, 0.0, 0.0, 0)
    if any(len(p) == 0 for p in prompts):
        raise ConfigError("generate_plain: a prompt is empty; every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ConfigError(f"generate_plain: max_new_tokens must be >= 1, got {max_new_tokens}")
    runner = _as_runner(runner_or_target, prompts, max_new_tokens, max_batch_size)
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > runner.max_seq_len:
        raise ConfigError(
            f"generate_plain: the longest prompt ({longest} tokens) + max_new_tokens={max_new_tokens} "
            f"exceeds the runner's max_seq_len={runner.max_seq_len}",
            fix="build the runner with a larger max_seq_len, or pass the LoadedTarget instead",
        )
    eos = tuple(runner.eos_token_ids if eos_token_ids is None else eos_token_ids)
    generator = None
    if temperature > 0.0:
        generator = torch.Generator(device=runner.device)
        generator.manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    per_batch = min(max_batch_size, runner.max_batch_size)
    pad = bool(getattr(runner, "use_graphs", False)) if pad_rows is None else pad_rows
    if continuous:
        if supports_continuous(runner) and longest <= PREFILL_TOKEN_BUDGET:
            rows = min(per_batch, len(prompts))
            result = generate_continuous(
                runner,
                prompts,
                max_new_tokens,
                temperature,
                top_p,
                generator,
                eos,
                rows=padded_rows(rows, runner.max_batch_size) if pad else rows,
                # a finished row idles until the next check: keep that short against the answers
                check_every=min(check_every, max(1, max_new_tokens // 8)),
            )
            log.info(
                "plain decoding (continuous, %d rows): %d prompts, %d new tokens, prefill %.3fs, decode %.3fs",
                rows,
                len(prompts),
                result.new_tokens,
                result.prefill_seconds,
                result.decode_seconds,
            )
            return result
        log.info(
            "plain decoding: continuous batching needs a runner with row-subset prefill; batching instead"
        )
    results: list[list[int]] = [[] for _ in prompts]
    prefill_s = decode_s = 0.0
    forwards = 0
    graphs_before, capture_s_before = _graph_stats(runner)
    for idx in length_buckets(order, [len(p) for p in prompts], per_batch):
        batch = [list(prompts[i]) for i in idx]
        rows = padded_rows(len(batch), runner.max_batch_size) if pad else None
        generated, p_s, d_s, n_fwd = _generate_batch(
            runner, batch, max_new_tokens, temperature, top_p, generator, eos, check_every, rows
        )
        for i, row in zip(idx, generated, strict=True):
            results[i] = row
        prefill_s, decode_s, forwards = prefill_s + p_s, decode_s + d_s, forwards + n_fwd
    graphs_after, capture_s_after = _graph_stats(runner)
    captured, capture_s = graphs_after - graphs_before, capture_s_after - capture_s_before
    new = sum(len(r) for r in results)
    log.info(
        "plain decoding: %d prompts, %d new tokens, prefill %.3fs, decode %.3fs (%.1f tok/s); "
        "%d CUDA graphs captured in %.2fs",
        len(prompts),
        new,
        prefill_s,
        decode_s,
        new / max(prefill_s + decode_s, 1e-9),
        captured,
        capture_s,
    )
    return PlainResult(
        results, sum(len(p) for p in prompts), new, prefill_s, decode_s, forwards, captured, capture_s
    )


def generate_plain(
    runner_or_target: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH,
    pad_rows: bool | None = None,
    continuous: bool = False,
) -> list[list[int]]:
    """As generate_plain_with_stats, returning the generated token ids per prompt only."""
    return generate_plain_with_stats(
        runner_or_target,
        prompts,
        max_new_tokens,
        temperature,
        top_p,
        seed,
        eos_token_ids,
        max_batch_size=max_batch_size,
        pad_rows=pad_rows,
        continuous=continuous,
    ).tokens
