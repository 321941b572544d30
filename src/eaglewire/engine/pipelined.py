"""The launch-ahead round loop (greedy, batch 1): round k+1 is enqueued before round k's verdict
reaches the host.

Greedy verification runs inside the verify forward (`forward(greedy=True)`), so everything the
next round needs is already on the device: the accepted path, its length and the emitted tokens,
hence the next root. The host enqueues round k+1 from those tensors, and only then waits for round
k's verdict (a non-blocking copy into pinned memory, then an event) and does the bookkeeping,
while the GPU runs round k+1:

    launch(0)                  draft(root) ; verify -> verdict_0 on the device ; start its copy
    round k:  advance(k)       draft.extend(aux_k[path_k]) ; target.commit(path_k) ;
                               root_{k+1} = bonus_k, position += count_k          (device only)
              launch(k+1)      draft(root_{k+1}) ; verify ; start verdict_{k+1}'s copy
              read(k)          wait for verdict_k ; emit its tokens ; stop?       (host, GPU busy)

A stop found by read(k) leaves round k+1 in flight: its tokens are never emitted, and what it
wrote is provisional (uncommitted target K/V, draft tree rows), so the tokens, the traces and the
committed state are the lockstep loop's (`engine.speculative`).

The host knows round k's root position exactly (read(k-1) told it) but not round k's count, so
sizes chosen for round k+1 come from a bound: its root position is at most position_k + P_k, P_k
= the most path nodes round k's tree has (`DraftTree.max_path_nodes`). The draft extend feeds P_k
rows (those past the accepted path are provisional), the target commits P_k path slots of which
the device's count are real, and the windows (which CUDA graph replays) come from the bound; every
mask reads the true lengths on the device. Round k+1 is launched only after read(k) when it might
not fit the runner's max_seq_len under the bound, and not at all when round k certainly ends the
generation (max_new_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.engine.decode_trace import DecodeTrace
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.protocol import LaunchAheadRunner, TargetRunner, can_launch_ahead
from eaglewire.engine.timers import PhaseTimers
from eaglewire.engine.tree import DeviceRoot, root_only
from eaglewire.engine.verify import DeviceVerdict, StopRule, verdict_from_values
from eaglewire.errors import ConfigError


class VerdictCopies:
    """Verdicts on their way to the host: a non-blocking copy into pinned memory and an event per
    verdict, two buffers per size used in turn (round k+1's copy starts before round k's is read).
    On CPU the copy is a plain one.

    The copies run on the current stream, and each event is recorded on it: that stream is looked
    up once, here (one object per loop, which never switches streams), not on every record."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.current_stream(device) if self.cuda else None
        self._slots: dict[int, list[tuple[torch.Tensor, torch.cuda.Event | None]]] = {}
        self._turn: dict[int, int] = {}

    def start(self, packed: torch.Tensor) -> PendingRead:
        """packed [S] int64 on the device -> a handle whose `wait` returns it as host ints."""
        size = packed.shape[0]
        if size not in self._slots:
            self._slots[size] = [
                (
                    torch.empty(size, dtype=torch.long, pin_memory=self.cuda),
                    torch.cuda.Event() if self.cuda else None,
                )
                for _ in range(2)
            ]
            self._turn[size] = 0
        buffer, event = self._slots[size][self._turn[size]]
        self._turn[size] ^= 1
        buffer.copy_(packed, non_blocking=self.cuda)
        if event is not None:
            event.record(self._stream)
        return PendingRead(buffer, event)


@dataclass
class PendingRead:
    buffer: torch.Tensor  # [S] host (pinned on CUDA)
    event: torch.cuda.Event | None  # recorded after the copy; None on CPU

    def wait(self) -> list[int]:
        """Block until the copy landed (only this verdict's work, not the rounds queued after it)."""
        if self.event is not None:
            self.event.synchronize()
        values: list[int] = self.buffer.tolist()
        return values


@dataclass
class _Round:
    """A launched round: where its root is, its tree's shape, the verify outputs the next round
    needs, and its verdict on the way to the host."""

    root: DeviceRoot
    chain: bool  # every accepted path is a prefix of the nodes (commit without moving K/V)
    verdict: DeviceVerdict  # P = the tree's max_path_nodes path slots
    aux: torch.Tensor  # [N, A*Ht] the verify forward's aux states
    read: PendingRead


def launch_ahead_rounds(
    runner: TargetRunner,
    drafter: Drafter | None,
    root_token: int,
    root_position: int,
    stop: StopRule,
    trace: DecodeTrace,
    timers: PhaseTimers,
) -> None:
    """Greedy rounds from the root (prefill done) until `stop`, the next round always in flight
    (see the module doc); fills `trace` as the lockstep loop does."""
    if not can_launch_ahead(runner):
        raise ConfigError(
            f"launch-ahead rounds: {type(runner).__name__} cannot run them (`can_launch_ahead`)"
        )
    device = runner.device
    copies = VerdictCopies(device)
    capacity = runner.max_seq_len
    position = root_position  # exact: the root position of the round in flight (`current`)
    root = DeviceRoot(
        token=torch.full((1,), root_token, dtype=torch.long, device=device),
        position=torch.full((1,), root_position, dtype=torch.long, device=device),
        position_bound=root_position,
    )
    if drafter is not None:
        drafter.reserve(capacity)
    current = _launch(runner, drafter, root, copies, timers)
    while True:
        ahead = None
        certain_end = len(trace.token_ids) + 1 >= stop.max_new_tokens  # the round emits >= 1 token
        P = current.verdict.path.shape[0]
        if not certain_end and position + P + _next_num_nodes(drafter) <= capacity:
            ahead = _launch(
                runner, drafter, _advance(runner, drafter, current, position, timers), copies, timers
            )
        with timers.phase("accept"):
            verdict = verdict_from_values(current.read.wait())
            finished = trace.record(verdict, stop)
        if finished:
            return  # a round launched ahead is discarded (module doc)
        if ahead is None:  # near the end of the cache: launch knowing the count
            nxt = _advance(runner, drafter, current, position, timers, count=len(verdict.path))
            ahead = _launch(runner, drafter, nxt, copies, timers)
        position += len(verdict.path)
        current = ahead


def _next_num_nodes(drafter: Drafter | None) -> int:
    """Nodes of the trees after the first extend: the root alone without a draft."""
    return 1 if drafter is None else drafter.spec.num_draft_tokens


def _launch(
    runner: LaunchAheadRunner,
    drafter: Drafter | None,
    root: DeviceRoot,
    copies: VerdictCopies,
    timers: PhaseTimers,
) -> _Round:
    """Enqueue a round's draft and verify forward from a device-side root; start its verdict's copy."""
    with timers.phase("draft"):
        tree = root_only(root.token, runner.device) if drafter is None else drafter.draft_tree_at(root)
    with timers.phase("verify"):
        fwd = runner.forward(
            tree.tokens[None],
            (tree.depths + root.position)[None],
            tree.ancestor_mask()[None],
            greedy=True,
            length_bound=root.position_bound,
        )
        if fwd.greedy is None:
            raise ConfigError("launch-ahead: the runner's forward(greedy=True) returned no verdict")
        packed = fwd.greedy[0]  # [1 + 2N]
        read = copies.start(packed)
    return _Round(
        root=root,
        chain=drafter is None or drafter.spec.is_chain,
        verdict=DeviceVerdict.of(packed, tree.max_path_nodes),
        aux=fwd.aux[0],
        read=read,
    )


def _advance(
    runner: LaunchAheadRunner,
    drafter: Drafter | None,
    done: _Round,
    position: int,
    timers: PhaseTimers,
    count: int | None = None,
) -> DeviceRoot:
    """Enqueue what follows a verified round: draft rows and target K/V of its accepted path, and
    the next root, from its device-side verdict. position: its root position (exact on the host);
    count: its accepted path length when the host has read it (a tighter bound)."""
    verdict = done.verdict
    if drafter is not None:
        with timers.phase("draft"):
            drafter.extend_verified(done.aux, verdict, start_position=position)
    with timers.phase("accept"):
        if done.chain:
            runner.commit_prefix(verdict.count)  # the count stays on the device
        else:
            runner.commit(verdict.path[None], verdict.count)  # [1, P] of which count are real
        P = verdict.path.shape[0]
        return DeviceRoot(
            token=verdict.bonus(),
            position=done.root.position + verdict.count,
            position_bound=position + (P if count is None else count),
        )
