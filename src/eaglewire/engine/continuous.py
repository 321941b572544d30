"""Continuous batching for plain generation: a row that finishes takes the next prompt.

`generate_plain` runs a batch until its last row ends (eos or max_new_tokens), so when a few
answers run long every other row idles; data regeneration saw half its answers hit the limit. Here
the runner keeps its full batch of rows: every `check_every` decoding steps the host reads which
rows ended, collects their tokens and, once at least `refill_fraction` of the rows are free (or no
row is running), empties them and prefills the next prompts into just those rows
(`reset_rows` / `prefill_rows` / `commit_rows` of the runner), while the other rows keep their
caches. Rows never see each other, so each prompt's tokens are those `generate_plain` gives
(greedy; sampling draws the same distributions from a different random stream).

Needs a runner with row-subset prefill (`FastTargetRunner`); `generate_plain_with_stats(...,
continuous=True)` falls back to batches for others.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from eaglewire.engine.plain_parts import PREFILL_TOKEN_BUDGET, PlainResult, right_padded, sample_next

REFILL_FRACTION = 0.25  # refill once this share of the rows is free (each refill is a prefill forward)


def supports_continuous(runner: Any) -> bool:
    return all(hasattr(runner, name) for name in ("reset_rows", "prefill_rows", "commit_rows"))


def prefill_groups(slots: list[int], prompts: list[list[int]]) -> list[tuple[list[int], list[list[int]]]]:
    """Split (slot, prompt) pairs, longest prompt first, into groups whose padded size fits the
    prefill budget (a group is one forward of [k, its longest prompt])."""
    pairs = sorted(zip(slots, prompts, strict=True), key=lambda sp: -len(sp[1]))
    groups: list[tuple[list[int], list[list[int]]]] = []
    for slot, prompt in pairs:
        if groups and (len(groups[-1][0]) + 1) * len(groups[-1][1][0]) <= PREFILL_TOKEN_BUDGET:
            groups[-1][0].append(slot)
            groups[-1][1].append(prompt)
        else:
            groups.append(([slot], [prompt]))
    return groups


def generate_continuous(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    eos: tuple[int, ...],
    *,
    rows: int,
    check_every: int = 16,
    refill_fraction: float = REFILL_FRACTION,
) -> PlainResult:
    """Decode every prompt on `rows` runner rows, refilling finished rows (see the module doc).
    Returns the generated ids per prompt (in prompt order), ending with eos when one was produced."""
    dev = runner.device
    B = rows
    runner.reset(B)
    queue = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))  # longest first
    owner = [-1] * B  # prompt index each row is generating for; -1 = free
    results: list[list[int]] = [[] for _ in prompts]
    out = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)  # [B, max_new]
    count = torch.zeros(B, dtype=torch.long, device=dev)  # tokens generated per row
    done = torch.ones(B, dtype=torch.bool, device=dev)  # free rows count as done
    tok = torch.zeros(B, dtype=torch.long, device=dev)  # [B] the token each row feeds next
    eos_t = torch.tensor(eos, dtype=torch.long, device=dev)
    arange = torch.arange(B, device=dev)
    prefill_s = decode_s = 0.0
    forwards = 0

    def ended(token: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        stop = n >= max_new_tokens
        return stop | torch.isin(token, eos_t) if eos else stop

    def refill(free: list[int]) -> None:
        take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
        slots = free[: len(take)]
        if not slots:
            return
        runner.reset_rows(slots)
        for group_slots, group in prefill_groups(slots, [list(prompts[i]) for i in take]):
            ids, lens = right_padded(group)
            k, T = ids.shape
            pos = torch.arange(T, device=dev).expand(k, T)
            fwd = runner.prefill_rows(group_slots, ids.to(dev), pos, (lens - 1).to(dev))
            runner.commit_rows(group_slots, lens.tolist())
            first = sample_next(fwd.logits[:, 0], temperature, top_p, generator)  # [k]
            where = torch.tensor(group_slots, device=dev)
            tok[where] = first
            out[where, 0] = first
            count[where] = 1
            done[where] = ended(first, count[where])
        for slot, i in zip(slots, take, strict=True):
            owner[slot] = i

    def harvest() -> list[int]:
        """Collect the rows that ended; return the free rows."""
        done_host = done.tolist()
        finished = [r for r in range(B) if done_host[r] and owner[r] >= 0]
        if finished:
            idx = torch.tensor(finished, device=dev)
            tokens, counts = out[idx].tolist(), count[idx].tolist()
            for r, row, n in zip(finished, tokens, counts, strict=True):
                results[owner[r]] = row[:n]
                owner[r] = -1
        return [r for r in range(B) if owner[r] < 0]

    t0 = time.perf_counter()
    refill(list(range(B)))
    prefill_s += time.perf_counter() - t0
    step = 0
    t1 = time.perf_counter()
    while True:
        if step % check_every == 0:
            free = harvest()
            if not queue and len(free) == B:
                break
            if queue and (len(free) >= refill_fraction * B or len(free) == B):
                t_refill = time.perf_counter()
                refill(free)
                prefill_s += time.perf_counter() - t_refill
        o = runner.forward(tok[:, None], runner.lengths[:, None])
        running = ~done
        runner.commit_prefix(running.long())  # rows that ended keep their length (no growth)
        nxt = sample_next(o.logits[:, 0], temperature, top_p, generator)  # [B]
        slot = count.clamp(max=max_new_tokens - 1)
        out[arange, slot] = torch.where(running, nxt, out[arange, slot])
        count += running.long()
        done |= running & ended(nxt, count)
        tok = nxt
        step += 1
        forwards += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    decode_s = time.perf_counter() - t1 - (prefill_s - (t1 - t0))  # the loop minus its refills
    new = sum(len(r) for r in results)
    return PlainResult(results, sum(len(p) for p in prompts), new, prefill_s, max(decode_s, 0.0), forwards)
