"""Speculative decoding for many requests at once, with continuous batching (`BatchEngine`).

Each round every running row drafts its own tree, one target forward verifies all B trees
(ragged: each row accepts its own path), and each row commits its own count at its own cache
positions. A row that ends (eos, max tokens, stop string, cancel) is freed at once and the next
waiting request is prefilled into it while the others go on.

    submit(request)   queue a request (checked against the target's context now, `engine.fits`)
    step()            admit waiting requests into free rows, then one round; returns the finished
    run(requests)     submit all, step until done: the traces in request order

The batch is a bucket size (1, 2, 4, ... up to max_rows): CUDA graphs exist per batch size, so
the runner and the drafter run B = the smallest bucket that holds the running rows; idle rows
of the bucket verify a dummy root and commit nothing. The bucket grows when requests wait, and
shrinks (moving rows down) when rows end and none wait.

Which setting a round uses is the `policy`'s choice from the number of running rows: the draft's
setting, a shorter one, or None (plain decoding: every tree is its root). The drafter is extended
in plain rounds too, so a later speculative round drafts from current states. Rows never see each
other, so greedy rows emit exactly the tokens they emit alone (float32; the tests pin B = 1, 2, 5
with refills); a sampled row draws with its own generators, seeded as `SpeculativeDecoder.generate`
seeds them, and gives the output it gives alone.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from eaglewire.engine.batch.buckets import bucket_for, compaction_moves
from eaglewire.engine.batch.drafter import BatchDrafter, RowSampler, RowTrees
from eaglewire.engine.continuous import prefill_groups
from eaglewire.engine.decode_trace import DecodeTrace, RoundCallback
from eaglewire.engine.fits import ContextFit
from eaglewire.engine.plain_parts import right_padded
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.sampling import SamplingParams, make_generator
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.tree import DraftTree, root_only
from eaglewire.engine.verify import StopRule, Verdict, verdict_from_values, verify
from eaglewire.errors import ConfigError

# Admit waiting requests once this share of the bucket's rows is free (or nothing runs): each
# admission is an eager prefill forward, so refilling one row at a time would prefill every round.
REFILL_FRACTION = 0.125

# The setting a round with this many running rows uses (None: plain decoding).
Policy = Callable[[int], SpecArgs | None]


@dataclass
class BatchRequest:
    prompt_ids: list[int]
    stop: StopRule
    sampling: SamplingParams = field(default_factory=SamplingParams)
    on_round: RoundCallback | None = None  # each round's kept tokens; False cancels (decode_trace)


@dataclass
class BatchOutcome:
    request: BatchRequest
    trace: DecodeTrace
    submitted_at: float  # perf_counter seconds
    started_at: float  # when its prefill ran
    finished_at: float


@dataclass
class RoundStats:
    """Wall seconds of every round by (bucket size, setting label): the cost table's raw data."""

    seconds: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    tokens: dict[tuple[int, str], int] = field(default_factory=dict)  # tokens emitted (running rows)
    prefill_seconds: float = 0.0

    def add(self, bucket: int, label: str, seconds: float, emitted: int) -> None:
        self.seconds.setdefault((bucket, label), []).append(seconds)
        self.tokens[(bucket, label)] = self.tokens.get((bucket, label), 0) + emitted


@dataclass
class _Row:
    request: BatchRequest
    trace: DecodeTrace
    root: int
    root_position: int
    verify_generator: torch.Generator
    draft_sampler: RowSampler | None
    submitted_at: float
    started_at: float
    # whether the draft has a state to draft from: not before the first round of a one-token
    # prompt, whose first tree is its root alone (as `speculative_generate` verifies it)
    drafted: bool = True


def setting_label(spec: SpecArgs | None) -> str:
    return "plain" if spec is None else f"{spec.num_steps}x{spec.topk}x{spec.num_draft_tokens}"


class BatchEngine:
    def __init__(
        self,
        runner: FastTargetRunner,
        drafter: BatchDrafter | None,
        *,
        max_rows: int,
        policy: Policy | None = None,
        refill_fraction: float = REFILL_FRACTION,
    ) -> None:
        if max_rows < 1:
            raise ConfigError(f"max_rows: expected >= 1, got {max_rows}", fix="--max-batch 1 or more")
        if runner.max_batch_size < max_rows:
            raise ConfigError(
                f"the runner holds {runner.max_batch_size} rows, the engine wants {max_rows}",
                fix="build the runner with max_batch_size >= max_rows",
            )
        if drafter is not None and drafter.max_rows < max_rows:
            raise ConfigError(f"the drafter holds {drafter.max_rows} rows, the engine wants {max_rows}")
        self.runner = runner
        self.drafter = drafter
        self.max_rows = max_rows
        self.refill_fraction = refill_fraction
        spec = None if drafter is None else drafter.spec
        self.policy: Policy = policy or (lambda _running: spec)
        self.device = runner.device
        # every request is checked against it when submitted (`engine.fits`), not mid-flight
        self.fit = ContextFit.of(
            positions=runner.max_positions,
            capacity=runner.max_seq_len,
            tree_tokens=0 if drafter is None else drafter.spec.num_draft_tokens,
        )
        self.stats = RoundStats()
        self._waiting: deque[tuple[BatchRequest, float]] = deque()
        self._rows: list[_Row | None] = [None]
        runner.reset(1)
        if drafter is not None:
            drafter.reset_rows(range(max_rows))

    # -- public ------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return sum(row is not None for row in self._rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._waiting and self.running == 0

    @property
    def bucket(self) -> int:
        return len(self._rows)

    def submit(self, request: BatchRequest) -> None:
        if not request.prompt_ids:
            raise ConfigError("prompt_ids is empty: at least one token is needed")
        self.fit.check(len(request.prompt_ids), request.stop.max_new_tokens)
        self._waiting.append((request, time.perf_counter()))

    def run(self, requests: Sequence[BatchRequest]) -> list[DecodeTrace]:
        """Decode every request (continuous batching); their traces in request order."""
        for request in requests:
            self.submit(request)
        done: dict[int, DecodeTrace] = {}
        while not self.idle:
            for outcome in self.step():
                done[id(outcome.request)] = outcome.trace
        return [done[id(r)] for r in requests]

    @torch.no_grad()
    def step(self) -> list[BatchOutcome]:
        """Admit waiting requests into free rows, run one round; the requests that ended in it."""
        self._admit()
        if self.running == 0:
            return []
        return self._round()

    # -- rows ----------------------------------------------------------------------------------------
    def _resize(self, bucket: int) -> None:
        if bucket == len(self._rows):
            return
        if bucket < len(self._rows):  # move the running rows down first
            for src, dst in compaction_moves([row is not None for row in self._rows], bucket):
                self.runner.move_row(src, dst)
                if self.drafter is not None:
                    self.drafter.move_row(src, dst)
                self._rows[dst], self._rows[src] = self._rows[src], None
            del self._rows[bucket:]
        else:
            self._rows.extend([None] * (bucket - len(self._rows)))
        self.runner.resize(bucket)

    def _admit(self) -> None:
        running = self.running
        want = bucket_for(min(self.max_rows, running + len(self._waiting)), self.max_rows)
        if want > len(self._rows) or (not self._waiting and want < len(self._rows)):
            self._resize(max(want, 1))
        free = [r for r, row in enumerate(self._rows) if row is None]
        if running and len(free) < self.refill_fraction * len(self._rows):
            return  # a prefill forward per admission: wait until a few rows are free
        take = [self._waiting.popleft() for _ in range(min(len(free), len(self._waiting)))]
        if not take:
            return
        t0 = time.perf_counter()
        slots = free[: len(take)]
        self.runner.reset_rows(slots)
        if self.drafter is not None:
            self.drafter.reset_rows(slots)
        prompts = {slot: request.prompt_ids for slot, (request, _) in zip(slots, take, strict=True)}
        with_context = [s for s in slots if len(prompts[s]) > 1]
        if with_context:
            contexts = [prompts[s][:-1] for s in with_context]  # the newest token is the first root
            for group_slots, group in prefill_groups(with_context, contexts):
                self._prefill(group_slots, group, prompts)
        for slot, (request, submitted) in zip(slots, take, strict=True):
            sampling = request.sampling
            draft_sampler = None
            if not sampling.greedy and self.drafter is not None:
                draft_generator = make_generator(SamplingParams(seed=sampling.seed + 1), self.drafter.device)
                draft_sampler = RowSampler(sampling, draft_generator)
            self._rows[slot] = _Row(
                request=request,
                trace=DecodeTrace(token_ids=[], finish_reason="max_new_tokens", on_round=request.on_round),
                root=request.prompt_ids[-1],
                root_position=len(request.prompt_ids) - 1,
                verify_generator=make_generator(sampling, "cpu"),
                draft_sampler=draft_sampler,
                submitted_at=submitted,
                started_at=t0,
                drafted=len(request.prompt_ids) > 1,
            )
        self.stats.prefill_seconds += time.perf_counter() - t0

    def _prefill(self, slots: list[int], contexts: list[list[int]], prompts: dict[int, list[int]]) -> None:
        ids, lens = right_padded(contexts)  # [k, T]
        k, T = ids.shape
        dev = self.device
        pos = torch.arange(T, device=dev).expand(k, T)
        fwd = self.runner.prefill_rows(slots, ids.to(dev), pos, (lens - 1).to(dev))
        self.runner.commit_rows(slots, lens.tolist())
        if self.drafter is not None:
            for i, slot in enumerate(slots):
                n = int(lens[i])
                self.drafter.prefill_row(slot, fwd.aux[i, :n], torch.tensor(prompts[slot][1 : n + 1]))

    # -- one round ---------------------------------------------------------------------------------------
    def _round(self) -> list[BatchOutcome]:
        t0 = time.perf_counter()
        rows = self._rows
        B = len(rows)
        dev = self.device
        live = [r for r, row in enumerate(rows) if row is not None]
        spec = self.policy(len(live)) if self.drafter is not None else None
        roots = torch.tensor([row.root if row else 0 for row in rows]).to(dev, non_blocking=True)
        positions = torch.tensor([row.root_position if row else 0 for row in rows]).to(dev, non_blocking=True)
        trees: RowTrees | None = None
        if spec is not None and self.drafter is not None:
            samplers = None
            if spec.is_chain:
                samplers = [row.draft_sampler if row and row.drafted else None for row in rows]
            trees = self.drafter.draft_trees(roots, positions, spec, samplers)
            tokens, mask, node_positions = trees.tokens, trees.ancestors, trees.depths + positions[:, None]
        else:
            tokens, mask, node_positions = roots[:, None], None, positions[:, None]
        N = int(tokens.shape[1])
        fwd = self.runner.forward(tokens, node_positions, mask, greedy=True, copy_outputs=False)
        assert fwd.greedy is not None
        packed = fwd.greedy  # [B, 1 + 2N]
        host = packed.tolist()  # the round's one read of the device
        verdicts: dict[int, Verdict] = {}
        for r in live:
            row = rows[r]
            assert row is not None
            if row.request.sampling.greedy:
                verdicts[r] = verdict_from_values(host[r])
            else:
                tree = self._row_tree(trees if row.drafted else None, r, tokens)
                verdicts[r] = verify(tree, fwd.logits[r], row.request.sampling, row.verify_generator)
        counts = [len(verdicts[r].path) if r in verdicts else 0 for r in range(B)]
        P = 1 if trees is None else trees.max_path_nodes
        if all(rows[r] is not None and rows[r].request.sampling.greedy for r in live):  # type: ignore[union-attr]
            paths, emitted = packed[:, 1 : 1 + P], packed[:, 1 + N : 1 + N + P]  # [B, P] on the device
        else:
            paths, emitted = self._host_paths(verdicts, B, P)
        counts_cpu = torch.tensor(counts)
        if self.drafter is not None:
            self.drafter.extend_verified(
                fwd.aux, paths, emitted, counts_cpu.to(dev, non_blocking=True), counts
            )
        if all(verdicts[r].path == list(range(counts[r])) for r in live):
            self.runner.commit_prefix(counts_cpu)  # every path is a prefix of its tree: nothing moves
        else:
            self.runner.commit(paths, counts_cpu)
        finished = self._record(verdicts)
        self.stats.add(B, setting_label(spec), time.perf_counter() - t0, sum(counts))
        return finished

    def _row_tree(self, trees: RowTrees | None, r: int, tokens: torch.Tensor) -> DraftTree:
        if trees is None:
            return root_only(tokens[r, 0], tokens.device)
        draft_probs = None if trees.draft_probs is None else trees.draft_probs[r]
        return DraftTree(
            trees.tokens[r],
            trees.parents[r],
            trees.depths[r],
            depth_limit=trees.depth_limit,
            draft_probs=draft_probs,
            ancestors=trees.ancestors[r],
        )

    def _host_paths(self, verdicts: dict[int, Verdict], B: int, P: int) -> tuple[torch.Tensor, torch.Tensor]:
        paths = torch.zeros(B, P, dtype=torch.long)
        emitted = torch.zeros(B, P, dtype=torch.long)
        for r, verdict in verdicts.items():
            n = len(verdict.path)
            paths[r, :n] = torch.tensor(verdict.path)
            emitted[r, :n] = torch.tensor(verdict.emitted)
        return paths.to(self.device), emitted.to(self.device)

    def _record(self, verdicts: dict[int, Verdict]) -> list[BatchOutcome]:
        finished: list[BatchOutcome] = []
        now = time.perf_counter()
        for r, verdict in verdicts.items():
            row = self._rows[r]
            assert row is not None
            row.drafted = True
            if row.trace.record(verdict, row.request.stop):
                finished.append(BatchOutcome(row.request, row.trace, row.submitted_at, row.started_at, now))
                self._rows[r] = None
                self.runner.reset_rows([r])
                if self.drafter is not None:
                    self.drafter.reset_rows([r])
            else:
                row.root = verdict.emitted[-1]
                row.root_position += len(verdict.emitted)
        return finished
