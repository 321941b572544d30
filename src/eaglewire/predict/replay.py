"""The acceptance-length prediction's pure math: static trees as rank paths, the drafts each round
accepts, and the replay of held-out responses the way an engine decodes them (no model, no data
loading: `eaglewire.predict.evaluation` measures the ranks these read; its docstring says what the
prediction assumes). Shapes: N rows (positions, record slices back to back), S steps.

Replay (the default prediction): a tree is a set of nodes, each a path of ranks (r_1, ..., r_d)
from the root; the drafts a round starting at row t accepts are the longest prefix of the row's
true rank path that is a node of the tree (`accepted_drafts`). Each response (a run of rows valid
at step 0 inside one record, `response_spans`) is decoded from its first row: n accepted -> n + 1
tokens, the next round at t + n + 1 (`replay_accepted`). The position-averaged formulas
(`predicted_tau_chain`, `predicted_tau_tree`) average over every row instead and overestimate
live tau when draft errors cluster.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch

from eaglewire.errors import ConfigError


def predicted_tau_chain(cond_acc: Sequence[float], k: int) -> float:
    """The position-averaged chain formula (module docstring): 1 + sum_{s=1..k} prod_{j<=s} cond_acc[j-1];
    a NaN (no positions) counts as 0. Overestimates live tau; `replay_tree` is the default prediction."""
    if k < 0 or k > len(cond_acc):
        raise ConfigError(
            f"chain length k={k}: expected 0..{len(cond_acc)} (accuracy measured for {len(cond_acc)} steps)"
        )
    tau, prod = 1.0, 1.0
    for a in cond_acc[:k]:
        prod *= a if math.isfinite(a) else 0.0
        tau += prod
    return tau


def full_tree(topk: int, depth: int) -> list[tuple[int, ...]]:
    """Every rank path with ranks < topk and length 1..depth (a full topk-ary tree)."""
    return [p for d in range(1, depth + 1) for p in product(range(topk), repeat=d)]


def validate_tree(tree: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    nodes = [tuple(int(r) for r in p) for p in tree]
    known = set(nodes)
    for p in nodes:
        if not p or min(p) < 0:
            raise ConfigError(f"tree node {list(p)}: expected a non-empty path of ranks >= 0")
        if len(p) > 1 and p[:-1] not in known:
            raise ConfigError(f"tree node {list(p)}: its parent {list(p[:-1])} is not in the tree")
    if len(known) != len(nodes):
        raise ConfigError("tree: duplicated nodes")
    return nodes


def _check_depth(nodes: Sequence[tuple[int, ...]], steps: int) -> int:
    depth = max(len(p) for p in nodes)
    if depth > steps:
        raise ConfigError(
            f"tree depth {depth} exceeds the {steps} steps evaluated",
            fix=f"evaluate with --num-steps {depth}",
        )
    return depth


def chain_tree(k: int) -> list[tuple[int, ...]]:
    """The chain of k draft tokens as a tree: (0,), (0, 0), ..., (0,)*k."""
    return [(0,) * d for d in range(1, k + 1)]


def predicted_tau_tree(ranks: torch.Tensor, valid: torch.Tensor, tree: Sequence[Sequence[int]]) -> float:
    """The position-averaged tree formula (module docstring); ranks [N, S] int, valid [N, S] bool per
    position and depth. Overestimates live tau; `replay_tree` is the default prediction."""
    nodes = validate_tree(tree)
    _check_depth(nodes, ranks.shape[1])
    tau = 1.0
    for path in nodes:
        match = torch.ones(ranks.shape[0], dtype=torch.bool)
        prob = 1.0
        for j, r in enumerate(path):
            den = valid[:, j] & match
            match = match & (ranks[:, j] == r)
            n_den = int(den.sum())
            prob *= int((den & match).sum()) / n_den if n_den else 0.0
        tau += prob
    return tau


def accepted_drafts(ranks: torch.Tensor, valid: torch.Tensor, tree: Sequence[Sequence[int]]) -> torch.Tensor:
    """ranks [N, S] int, valid [N, S] bool -> [N] int64: the drafts a round starting at each row
    accepts under greedy verification of the static `tree` (given the true prefix): the longest
    prefix of the row's rank path (ranks[t, 0], ranks[t, 1], ...) that is a tree node and valid."""
    nodes = validate_tree(tree)
    depth = _check_depth(nodes, ranks.shape[1])
    index = {p: i + 1 for i, p in enumerate(nodes)}  # node -> row of `child`; 0 = the root
    width = max(p[-1] for p in nodes) + 1  # ranks >= width have no node
    child = torch.full((len(nodes) + 1, width), -1, dtype=torch.long)  # [nodes+1, width]
    for p, i in index.items():
        child[index.get(p[:-1], 0), p[-1]] = i
    at = torch.zeros(ranks.shape[0], dtype=torch.long)  # [N] node reached so far
    alive = torch.ones(ranks.shape[0], dtype=torch.bool)
    accepted = torch.zeros(ranks.shape[0], dtype=torch.long)
    for j in range(depth):
        r = ranks[:, j].long()
        nxt = child[at, r.clamp(0, width - 1)]
        alive = alive & valid[:, j] & (r < width) & (nxt >= 0)
        at = torch.where(alive, nxt, at)
        accepted += alive
    return accepted


def response_spans(valid0: torch.Tensor, segments: Sequence[int]) -> list[tuple[int, int]]:
    """valid0 [N] bool (rows valid at step 0, record slices back to back), segments: rows per slice
    (sum N) -> [start, end) row spans of each response: a maximal run of valid rows inside one slice."""
    v = valid0.reshape(-1).bool()
    n = int(v.numel())
    if sum(segments) != n:
        raise ValueError(f"segments cover {sum(segments)} rows, expected {n}")
    first = torch.zeros(n, dtype=torch.bool)
    last = torch.zeros(n, dtype=torch.bool)
    offset = 0
    for size in segments:
        if size > 0:
            first[offset] = True
            last[offset + size - 1] = True
        offset += size
    prev = torch.cat([torch.zeros(1, dtype=torch.bool), v[:-1]]) if n else v
    nxt = torch.cat([v[1:], torch.zeros(1, dtype=torch.bool)]) if n else v
    starts = (v & (first | ~prev)).nonzero().squeeze(1).tolist()
    ends = (v & (last | ~nxt)).nonzero().squeeze(1).tolist()
    return [(int(a), int(b) + 1) for a, b in zip(starts, ends, strict=True)]


def response_turns(spans: Sequence[tuple[int, int]], segments: Sequence[int]) -> list[int]:
    """The 1-based index of each span (`response_spans`) among its record slice's responses: 1 for
    a conversation's first answer, 2 for the answer after the second user turn, ..."""
    ends, offset = [], 0
    for size in segments:
        offset += size
        ends.append(offset)
    turns, slice_index, turn = [], -1, 0
    for start, _ in spans:
        index = bisect.bisect_right(ends, start)  # the slice holding row `start`
        turn = turn + 1 if index == slice_index else 1
        slice_index = index
        turns.append(turn)
    return turns


@dataclass(frozen=True)
class Replay:
    """Greedy speculative decoding replayed over held-out responses (see the module docstring)."""

    tau: float  # tokens emitted per verification round, bonus included (1.0 when there are no rounds)
    rounds: int  # verification rounds
    tokens: int  # tokens the rounds emitted
    per_position_acceptance: list[float]  # [D] fraction of rounds that accepted >= j drafts, j = 1..D

    def to_json(self) -> dict[str, Any]:
        return {"tau": self.tau, "rounds": self.rounds, "tokens": self.tokens,
                "per_position_acceptance": self.per_position_acceptance}  # fmt: skip


def replay_accepted(
    accepted: torch.Tensor, spans: Sequence[tuple[int, int]], depth: int, horizon: int | None = None
) -> Replay:
    """accepted [N] int (drafts a round starting at each row accepts, at most `depth`), spans from
    `response_spans` -> the Replay: each response from its first row (the engine's first round drafts
    the response's first token), n accepted -> n + 1 tokens, next round at t + n + 1. `horizon`: rounds start only within the first `horizon` tokens of each
    response, as a decoder with max_new_tokens = horizon (None: whole responses)."""
    if horizon is not None and horizon < 1:
        raise ConfigError(f"replay horizon: expected >= 1 token (or None), got {horizon}")
    acc = accepted.tolist()
    hist = [0] * (depth + 1)  # rounds by number of accepted drafts
    for start, end in spans:
        t = start
        stop = end if horizon is None else min(end, start + horizon)
        while t < stop:
            n = acc[t]
            hist[n] += 1
            t += n + 1
    rounds = sum(hist)
    tokens = sum((n + 1) * h for n, h in enumerate(hist))
    per_position = [sum(hist[j:]) / rounds if rounds else 0.0 for j in range(1, depth + 1)]
    return Replay(tokens / rounds if rounds else 1.0, rounds, tokens, per_position)


def replay_tree(
    ranks: torch.Tensor,
    valid: torch.Tensor,
    segments: Sequence[int],
    tree: Sequence[Sequence[int]],
    horizon: int | None = None,
    answer: int | None = None,
) -> Replay:
    """ranks [N, S] int, valid [N, S] bool (record slices back to back), segments: rows per slice ->
    the replayed decoding of the static `tree` (a chain is `chain_tree(k)`), over the first
    `horizon` tokens of each response (None: all of it), of every record's `answer`-th response
    only (1: first answers, what a benchmark prompt's answer is; None: every response)."""
    nodes = validate_tree(tree)
    accepted = accepted_drafts(ranks, valid, nodes)  # checks the depth against S
    spans = response_spans(valid[:, 0], segments)
    if answer is not None:
        spans = [s for s, t in zip(spans, response_turns(spans, segments), strict=True) if t == answer]
    return replay_accepted(accepted, spans, max(len(p) for p in nodes), horizon)
