"""The speculative decoding loop (batch 1): draft a tree, verify it in one target forward, commit.

Bookkeeping invariant: the target cache holds every token except the newest one, the *root*.
Prefill therefore runs the prompt without its last token, and every round verifies a tree whose
root is the newest token, so even the first generated token comes out of a verification.
Without a draft the tree is the root alone and the loop is plain decoding on the same runner.

    prefill:  target(prompt[:-1]) -> commit; draft.extend(aux, prompt[1:])
    round:    tree   = draft(root)                              num_steps draft forwards
              fwd    = target(tree tokens, positions, mask)     one target forward
              verdict= verify(tree, fwd.logits)                 accepted path + bonus (one host read);
                                                                greedy: inside the forward's CUDA graph
              draft.extend(fwd.aux[path], emitted)              rows for the accepted tokens
              target.commit(path); emit verdict tokens; stop?   eos / stop string / max tokens
              root   = bonus

Two loops run these rounds, chosen in one place (`speculative_generate`):
  - launch-ahead (`engine.pipelined`): greedy on a CUDA runner that verifies inside its forward
    and takes a length bound (`can_launch_ahead`; the fast runtime). Round k+1 is enqueued from
    round k's device-side verdict before the host reads it; bookkeeping runs a round late.
  - lockstep (`_lockstep_rounds`, below): everything else (sampling decides on the host; the
    recompute runner; CPU, where nothing runs asynchronously to overlap). Each round waits
    for its verdict before the next is enqueued.
Both emit the same tokens and the same per-round traces (`launch_ahead=True` runs the first on
CPU too: the tests pin it there).

Streaming and cancellation: `on_round(kept)` is called after every verified round with the tokens
that round added (what `stop` kept of it, possibly none); returning False ends the generation after
that round with finish_reason "cancelled" (a server whose client went away stops at the next round).
"""

from __future__ import annotations

import inspect

import torch

from eaglewire.engine.decode_trace import DecodeTrace, RoundCallback
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.pipelined import launch_ahead_rounds
from eaglewire.engine.runners.protocol import (
    TargetRunner,
    can_launch_ahead,
    commit_leading,
    reserve_verify_width,
)
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.timers import PhaseTimers
from eaglewire.engine.tree import root_only
from eaglewire.engine.verify import StopRule, Verdict, verdict_from_path, verify
from eaglewire.errors import ConfigError


def _ids(tokens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=device)  # [1, T]


def _prefill(runner: TargetRunner, context: list[int]) -> torch.Tensor:
    """Run and commit `context` (all prompt tokens but the newest); return its aux [T-1, A*Ht].
    Prefill needs no logits: ask for the last row's only when the runner can (`logits_at`)."""
    device = runner.device
    n = len(context)
    extra = {}
    if "logits_at" in inspect.signature(runner.forward).parameters:
        extra["logits_at"] = torch.tensor([n - 1], device=device)
    fwd = runner.forward(_ids(context, device), torch.arange(n, device=device)[None], None, **extra)
    runner.commit(torch.arange(n, device=device)[None], torch.tensor([n], device=device))
    return fwd.aux[0]


def _commit(runner: TargetRunner, path: list[int], path_device: torch.Tensor, num_nodes: int) -> None:
    """Keep the accepted path's K/V. A path that is a prefix of the tree's nodes (every chain, and a
    tree's first-ranked branch) is already in place."""
    n = len(path)
    if path == list(range(n)):
        commit_leading(runner, torch.tensor([n]), num_nodes)  # a host count: no host-to-device copy
    else:
        runner.commit(path_device[None], torch.tensor([n]))  # a host count, as above


def speculative_generate(
    runner: TargetRunner,
    drafter: Drafter | None,
    prompt_ids: list[int],
    *,
    sampling: SamplingParams,
    stop: StopRule,
    verify_generator: torch.Generator | None = None,
    draft_generator: torch.Generator | None = None,
    launch_ahead: bool | None = None,
    timers: PhaseTimers | None = None,
    on_round: RoundCallback | None = None,
) -> DecodeTrace:
    """Generate after `prompt_ids` (>= 1 token). `drafter=None` decodes plainly on the same runner.
    launch_ahead: None = on CUDA whenever greedy decoding on this runner allows it; False =
    lockstep; True = launch-ahead (any device) or a ConfigError.
    timers: what times the phases (reset here; its summary becomes `phase_seconds`). A caller running
    many generations passes the same one each time, so its CUDA events are reused instead of made
    again (`engine.timers`); None = a new enabled one for this generation.
    on_round: called with each verified round's kept tokens; False ends the generation (module doc)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: at least one token is needed")
    ahead = _use_launch_ahead(runner, sampling, launch_ahead)
    device = runner.device
    if timers is None:
        timers = PhaseTimers(enabled=True, device=device)
    else:
        _check_timers(timers, device)
        timers.reset()
    runner.reset(1)
    if drafter is not None:
        drafter.reset()
        reserve_verify_width(runner, drafter.spec.num_draft_tokens)  # wide trees verify graphed too

    # Prefill: all but the newest prompt token enter the target cache; the newest is the first root.
    *context, root = prompt_ids
    if context:
        with timers.phase("prefill"):
            aux = _prefill(runner, context)
            if drafter is not None:
                drafter.extend(aux, torch.tensor(prompt_ids[1:]), start_position=0)

    trace = DecodeTrace(token_ids=[], finish_reason="max_new_tokens", on_round=on_round)
    root_position = len(prompt_ids) - 1
    if ahead:
        trace.loop = "launch_ahead"
        launch_ahead_rounds(runner, drafter, root, root_position, stop, trace, timers)
    else:
        _lockstep_rounds(
            runner,
            drafter,
            root,
            root_position,
            sampling,
            stop,
            trace,
            timers,
            verify_generator,
            draft_generator,
        )
    trace.phase_seconds = timers.summary()
    return trace


def _check_timers(timers: PhaseTimers, device: torch.device) -> None:
    # CUDA events around CPU work, or perf_counter around queued kernels, would time the wrong thing
    if timers.enabled and timers.cuda != (device.type == "cuda"):
        raise ConfigError(
            f"timers were made for device {timers.device}, the runner is on {device}",
            fix="build the PhaseTimers with device=runner.device",
        )


def _use_launch_ahead(runner: TargetRunner, sampling: SamplingParams, requested: bool | None) -> bool:
    possible = sampling.greedy and can_launch_ahead(runner)
    if requested and not possible:
        raise ConfigError(
            "launch_ahead=True needs greedy sampling and a runner that verifies inside its forward "
            f"and takes a length bound (the fast runtime); got {type(runner).__name__}, "
            f"temperature={sampling.temperature}",
            fix="launch_ahead=None picks the loop that applies",
        )
    if requested is None:  # on CPU every op waits for itself: there is no idle device to fill
        return possible and runner.device.type == "cuda"
    return requested


def _lockstep_rounds(
    runner: TargetRunner,
    drafter: Drafter | None,
    root: int,
    root_position: int,
    sampling: SamplingParams,
    stop: StopRule,
    trace: DecodeTrace,
    timers: PhaseTimers,
    verify_generator: torch.Generator | None,
    draft_generator: torch.Generator | None,
) -> None:
    """Rounds from the root (prefill done) until `stop`, each waiting for its verdict; fills `trace`."""
    device = runner.device
    # A runner that verifies greedily itself does it inside its verify forward (its CUDA graph).
    in_forward = sampling.greedy and "greedy" in inspect.signature(runner.forward).parameters
    extra = {"greedy": True} if in_forward else {}
    while True:
        with timers.phase("draft"):
            if drafter is None:
                tree = root_only(root, device)
            else:
                tree = drafter.draft_tree(root, root_position, sampling, draft_generator)
        with timers.phase("verify"):
            fwd = runner.forward(
                tree.tokens[None].to(device),
                tree.positions(root_position)[None].to(device),
                tree.ancestor_mask()[None].to(device),
                **extra,
            )
            verdict: Verdict = (
                verdict_from_path(fwd.greedy[0])
                if fwd.greedy is not None
                else verify(tree, fwd.logits[0], sampling, verify_generator)
            )
        path = verdict.path_device
        if path is None:  # sampled verification decides on the host
            path = torch.tensor(verdict.path, device=device)
        if drafter is not None:
            # Extend the draft first: the GPU runs it while the host does the bookkeeping below, the
            # host having just waited for verification. (After the last round it is wasted, not wrong.)
            with timers.phase("draft"):
                emitted = verdict.emitted_device
                if emitted is None:
                    emitted = torch.tensor(verdict.emitted)
                drafter.extend(fwd.aux[0, path], emitted, start_position=root_position)
        with timers.phase("accept"):
            _commit(runner, verdict.path, path, tree.num_nodes)
            finished = trace.record(verdict, stop)
        if finished:
            return
        root = verdict.emitted[-1]
        root_position += len(verdict.emitted)
