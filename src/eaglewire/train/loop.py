"""The training loop: contract check, planning, TTT steps, evaluation, checkpoints, resume.

(Just over 500 lines, one class: these share the Trainer's position and state; the row planning,
the plan fingerprint, the objective and the checkpoint format already live in their own modules.)

Loss scaling (why N processes equal one process with N times the batch): each step's loss is
the sum of per-row losses divided by the number of valid rows of that step over *all* micro-
batches of the optimizer step on *all* processes (all-reduced before any backward), times the
step weight; DDP/FSDP then average gradients over processes, which the loss pre-multiplies by
the world size to undo. The update is therefore the token-level mean over the global batch,
however it is split into processes and accumulation micro-batches.

Host syncs: the forward and backward never wait for the device (the rows each TTT step trains on
are planned from host tensors, `StepRows`); each optimizer step copies one small tensor to the
host (loss finiteness, gradient norm, token and metric counts) before `optimizer.step`, since a
non-finite update must be refused before it is applied. Nothing else waits on the device. Before
that copy the step prepares the next step's inputs (records -> target forwards), so their host
work overlaps this step's device work instead of leaving the device idle between steps.

Wall-time budget (`max_seconds`): the training time of the run, resumes included (saved with each
checkpoint), stops it after the step that passes the budget, and the learning-rate schedule
follows it (`eaglewire.train.schedule`), so a run cut by the clock still ends at the low rate.
Such a run plans each epoch when it gets there and estimates the schedule's steps
(`eaglewire.train.epoch_plans`); it ends by the clock or when its epochs run out.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from eaglewire.contract.contract import Contract
from eaglewire.draft.io import check_draft_matches_contract, save_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import ConfigError, TrainingError
from eaglewire.io_utils import atomic_write_json
from eaglewire.outputs import replacing_dir
from eaglewire.train.batches import RecordSource, Row, record_lengths, record_repeats
from eaglewire.train.checkpoint import Checkpoint, restore_rng, save_checkpoint, start_or_resume
from eaglewire.train.config import TrainConfig
from eaglewire.train.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    set_gradient_sync,
    wrap_model,
)
from eaglewire.train.epoch_plans import EpochPlans, check_resumed_plan, epoch_plan_sha256
from eaglewire.train.evaluate import EvalRanks, eval_rows, evaluate_model
from eaglewire.train.loss import NUM_COUNTS, StepCounts
from eaglewire.train.objective import TTTObjective, autocast_for
from eaglewire.train.reporting import MetricsSink, Progress
from eaglewire.train.schedule import build_optimizer, lr_at, set_lr, trainable_parameters
from eaglewire.train.step_inputs import StepInputs, next_group, prepare_step
from eaglewire.train.target_side import TargetSide, check_data_contract, check_dataset_identity
from eaglewire.train.ttt import StepRows

log = logging.getLogger(__name__)
# DEBUG: the record ids each process trains on in each optimizer step (fillers excluded), e.g. to
# check that the processes share every epoch's records out once each.
records_log = logging.getLogger(__name__ + ".records")

DRAFT_DIR = "draft"
SUMMARY_FILE = "train_summary.json"
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class TrainResult:
    out_dir: Path
    draft_dir: Path
    optimizer_steps: int
    train: dict[str, Any]  # last optimizer step's metrics
    eval: dict[str, Any] | None  # final held-out metrics
    tokens: int
    tokens_per_s: float


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        draft: Eagle3Draft,
        draft_contract: Contract,
        data: RecordSource[Any],
        target_side: TargetSide,
        *,
        out_dir: Path,
        eval_data: RecordSource[Any] | None,
        resume: bool,
        ctx: DistContext,
    ) -> None:
        self.cfg, self.data, self.target_side, self.ctx = config, data, target_side, ctx
        self.out_dir, self.eval_data, self.contract = Path(out_dir), eval_data, draft_contract
        check_draft_matches_contract(draft.config, draft_contract)
        check_data_contract(draft_contract, target_side.data_contract)
        check_dataset_identity(data, draft_contract, name="training data")
        if getattr(data, "meta", {}).get("split") == "eval":
            raise ConfigError(
                "the training data is a held-out evaluation split (index.json split='eval')",
                fix="train on a dataset built with `eaglewire data build --split train`; "
                "pass this one as --eval-data",
            )
        target_side.verify(draft_contract)
        repeats = record_repeats(data, config)  # a misnamed source is refused before any write
        ckpt = start_or_resume(
            self.out_dir,
            config,
            resume=resume,
            is_main=ctx.is_main,
            barrier=lambda: barrier(ctx),
            world_size=ctx.world_size,
        )
        if ckpt is not None:
            config = self.cfg = TrainConfig.load(
                self.out_dir
            )  # with any resume-mutable field the caller changed
        self.weights = config.step_weights()
        self.lengths = record_lengths(data)
        self.plans = EpochPlans(self.lengths, config, world_size=ctx.world_size, repeats=repeats)
        # the schedule's length; an estimate in a time-bounded run, which then ends by clock or epochs
        self.total_steps, self.exact_total = self.plans.schedule_steps()
        log.info("%d records, %d optimizer steps in epoch 0; the learning-rate schedule spans %s", len(self.lengths),
                 len(self.plans[0]), self.plans.describe_span(self.total_steps, self.exact_total))  # fmt: skip
        if self.total_steps == 0:
            raise ConfigError(
                f"no optimizer steps: {len(self.lengths)} records make no complete step "
                f"(batch_size={config.batch_size}, grad_accum_steps={config.grad_accum_steps}, processes={ctx.world_size})"
            )
        draft.to(ctx.device).train()
        draft.embed_tokens.weight.requires_grad_(config.train_embeddings)
        if ckpt is not None:
            draft.load_state_dict(ckpt.model_state)
        self.draft = draft
        objective = TTTObjective(
            draft,
            config.ttt_steps,
            config.loss,
            hard_label_weight=config.hard_label_weight,
            align_topk=config.align_topk,
            compile=config.compile,
            attention=config.ttt_attention,
        )
        self.model = wrap_model(objective, ctx, config.parallel)
        self.params = trainable_parameters(self.model)
        self.optimizer = build_optimizer(self.model, config)
        self.step, self.epoch, self.group, self.tokens_seen = 0, 0, 0, 0
        self.train_seconds = 0.0  # training time of the run before this launch (from the checkpoint)
        self.elapsed = 0.0  # training time of the run up to the current step (all processes agree)
        self.lr = 0.0  # the learning rate of the last optimizer step
        if ckpt is not None:
            self._restore(ckpt)
        self.autocast = autocast_for(config.precision, ctx.device)
        self.sink = MetricsSink(
            self.out_dir,
            enabled=ctx.is_main,
            tensorboard=config.tensorboard,
            resume_step=self.step if ckpt is not None else None,
        )
        self.last_checkpoint_step = self.step if ckpt is not None else -1

    # --- setup ---
    def _restore(self, ckpt: Checkpoint) -> None:
        st = ckpt.trainer_state  # rows per step already checked (start_or_resume)
        check_resumed_plan(st.get("epoch_plan_sha256"), self.plans, st["epoch"], st["group"], ckpt.path)
        set_optimizer_state_dict(
            self.model, self.optimizer, ckpt.optimizer_state, options=StateDictOptions(full_state_dict=True)
        )
        restore_rng(ckpt.rng_tensors, st["rng"])
        self.step, self.epoch, self.group, self.tokens_seen = (
            st["optimizer_step"],
            st["epoch"],
            st["group"],
            st["tokens_seen"],
        )
        self.train_seconds = self.elapsed = float(st.get("train_seconds", 0.0))
        log.info(
            "resumed from %s at optimizer step %d (epoch %d, group %d)",
            ckpt.path,
            self.step,
            self.epoch,
            self.group,
        )

    # --- one optimizer step ---
    def _normalizers(self, plans: list[StepRows]) -> torch.Tensor:
        """[S] global valid-row counts per step, all-reduced over processes (host counts: no sync)."""
        local = [sum(p.counts[s] for p in plans) for s in range(self.cfg.ttt_steps)]
        n = torch.tensor(local, dtype=torch.float64).to(self.ctx.device, non_blocking=True)
        return all_reduce_sum(n, self.ctx)

    def _prepare(self, epoch: int, index: int) -> StepInputs:
        return prepare_step(
            self.plans[epoch],
            epoch,
            index,
            data=self.data,
            target_side=self.target_side,
            cfg=self.cfg,
            ctx=self.ctx,
        )

    def _upcoming(self) -> tuple[int, int] | None:
        """(epoch, group) of the optimizer step after the current one, None when this is the last."""
        if self.exact_total and self.step + 1 >= self.total_steps:
            return None
        return next_group(self.plans, self.epoch, self.group)

    def _train_step(
        self, prepared: StepInputs, upcoming: tuple[int, int] | None = None
    ) -> tuple[dict[str, Any], float, int, StepInputs | None]:
        """One optimizer step on `prepared`; with `upcoming`, also prepares that step's inputs while
        this one still runs on the device, and returns them."""
        cfg, ctx = self.cfg, self.ctx
        micro, inputs, plans, real = prepared.micro, prepared.inputs, prepared.plans, prepared.real
        if records_log.isEnabledFor(logging.DEBUG):
            records_log.debug("rank %d epoch %d group %d records %s", ctx.rank, prepared.epoch, prepared.group,
                              prepared.record_ids)  # fmt: skip
        n_valid = self._normalizers(plans[:real])
        w = torch.tensor(self.weights, dtype=torch.float64).to(ctx.device, non_blocking=True)
        scale = torch.where(
            n_valid > 0, w * ctx.world_size / n_valid.clamp_min(1), torch.zeros_like(w)
        ).float()
        filler_scale = torch.zeros_like(scale)  # a filler micro-batch's gradients are exact zeros
        table = torch.zeros(cfg.ttt_steps, NUM_COUNTS, dtype=torch.float64, device=ctx.device)
        finite: list[torch.Tensor] = []
        for i, (inp, plan) in enumerate(zip(inputs, plans, strict=True)):
            with set_gradient_sync(self.model, i == len(inputs) - 1):
                with self.autocast:
                    out = self.model(inp, rows=plan)
                loss = (out.loss_sums.float() * (scale if i < real else filler_scale)).sum()
                finite.append(torch.isfinite(loss))
                loss.backward()
            if i < real:
                table += out.counts
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        bad_micro = ~torch.stack(finite)  # [micro-batches] non-finite loss
        tokens = float(sum(inp.batch.num_tokens for inp in inputs[:real]))  # host count, no sync
        # One all-reduce and one device->host copy for the whole step (counts are exact in float64).
        shared = torch.cat(
            [
                bad_micro.any().to(torch.float64).reshape(1),
                (~torch.isfinite(norm)).to(torch.float64).reshape(1),
                torch.tensor([tokens], dtype=torch.float64).to(ctx.device, non_blocking=True),
                table.reshape(-1),
            ]
        )
        all_reduce_sum(shared, ctx)
        # The next step's inputs now: its target forwards queue behind this step's backward, so the
        # device has work while the host waits for this step's numbers and applies the update (the
        # target does not depend on the draft's weights).
        following = self._prepare(*upcoming) if upcoming is not None else None
        host = torch.cat(
            [shared, norm.detach().to(torch.float64).reshape(1), bad_micro.to(torch.float64)]
        ).cpu()
        any_bad, any_nonfinite_norm, global_tokens = float(host[0]), float(host[1]), int(host[2])
        counts = StepCounts(cfg.ttt_steps)
        counts.table = host[3 : 3 + table.numel()].reshape(table.shape)
        norm_value = float(host[3 + table.numel()])
        if any_bad or any_nonfinite_norm:
            bad = [
                rid
                for inp, flag in zip(inputs, host[4 + table.numel() :].tolist(), strict=True)
                if flag
                for rid in inp.batch.record_ids
            ]
            self._raise_non_finite(bad, micro, norm_value)
        self.lr = lr_at(self.step, self.total_steps, cfg, time_fraction=self._time_fraction())
        set_lr(self.optimizer, self.lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return counts.summary(self.weights), norm_value, global_tokens, following

    def _time_fraction(self) -> float:
        return self.elapsed / self.cfg.max_seconds if self.cfg.max_seconds > 0 else 0.0

    def _raise_non_finite(self, bad: list[str], micro: list[list[Row]], norm: float) -> None:
        gathered = all_gather_objects(bad, self.ctx)
        named = list(dict.fromkeys(rid for part in gathered for rid in part))  # a filler repeats a record
        where = f"optimizer step {self.step + 1} (epoch {self.epoch}, batch {self.group} of the epoch)"
        if named:
            msg = f"non-finite loss at {where}; records in the offending micro-batch(es): {named}"
        else:
            ids = [str(self.data[s.record].record_id) for rows in micro for row in rows for s in row]
            msg = f"non-finite gradient norm ({norm}) at {where}; records of this step on rank {self.ctx.rank}: {ids}"
        raise TrainingError(msg, fix="inspect those records' hidden states (inf/NaN?) or lower learning_rate")

    # --- evaluation, checkpoints ---
    def evaluate(self) -> EvalRanks | None:
        if self.eval_data is None or len(self.eval_data) == 0:
            return None
        rows = eval_rows(
            self.eval_data,
            max_length=self.cfg.max_length,
            pack=self.cfg.pack,
            max_records=self.cfg.eval_max_records,
        )
        return evaluate_model(
            self.model,
            self.target_side,
            self.eval_data,
            rows,
            ctx=self.ctx,
            batch_size=self.cfg.batch_size,
            num_steps=self.cfg.ttt_steps,
            step_weights=self.weights,
            autocast=self.autocast,
            with_ranks=False,
        )

    def checkpoint(self) -> None:
        model_state = get_model_state_dict(self.model, options=_FULL)
        optim_state = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        if self.ctx.is_main:
            state = {
                k.removeprefix("draft."): v for k, v in model_state.items() if isinstance(v, torch.Tensor)
            }
            save_checkpoint(
                self.out_dir,
                step=self.step,
                model_state=state,
                draft_config=self.draft.config,
                contract=self.contract,
                optimizer_state=optim_state,
                keep=self.cfg.keep_checkpoints,
                trainer_state={
                    "optimizer_step": self.step,
                    "epoch": self.epoch,
                    "group": self.group,
                    "tokens_seen": self.tokens_seen,
                    "train_seconds": self.elapsed,
                    "total_steps": self.total_steps,
                    "rows_per_step": self.ctx.world_size * self.cfg.grad_accum_steps * self.cfg.batch_size,
                    "world_size": self.ctx.world_size,
                    "epoch_plan_sha256": epoch_plan_sha256(self.plans, self.epoch),
                    "scheduler": {
                        "kind": "warmup_cosine",
                        "step": self.step,
                        "time_fraction": self._time_fraction(),
                    },
                },
            )
        self.last_checkpoint_step = self.step
        barrier(self.ctx)

    # --- the run ---
    def run(self, *, stop_after_steps: int | None, progress: bool) -> TrainResult:
        cfg = self.cfg
        bar = Progress(total=self.total_steps, initial=self.step, enabled=progress and self.ctx.is_main,
                       max_seconds=cfg.max_seconds)  # fmt: skip
        last: dict[str, Any] = {}
        tokens_run, time_run = 0, 0.0
        prepared: StepInputs | None = None  # the current step's inputs, prepared during the last step
        started = perf_counter()
        try:
            while (self.step < self.total_steps or not self.exact_total) and self.epoch < len(self.plans):
                self._clock(started)
                if cfg.max_seconds and self.elapsed >= cfg.max_seconds:
                    log.info("wall-time budget of %.0f s reached after optimizer step %d",
                             cfg.max_seconds, self.step)  # fmt: skip
                    break
                groups = self.plans[self.epoch]
                if self.group >= len(groups):
                    self.epoch, self.group = self.epoch + 1, 0
                    continue
                t0 = perf_counter()
                if prepared is None or (prepared.epoch, prepared.group) != (self.epoch, self.group):
                    prepared = self._prepare(self.epoch, self.group)
                summary, norm, tokens, prepared = self._train_step(prepared, self._upcoming())
                dt = perf_counter() - t0  # up to the step's one sync (its optimizer update may still run)
                self.step, self.group, self.tokens_seen = (
                    self.step + 1,
                    self.group + 1,
                    self.tokens_seen + tokens,
                )
                tokens_run, time_run = tokens_run + tokens, time_run + dt
                last = {
                    **summary,
                    "lr": self.lr,
                    "grad_norm": norm,
                    "tokens": tokens,
                    "tokens_per_s": tokens / dt if dt > 0 else 0.0,
                }
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self.sink.write({"split": "train", "step": self.step, "epoch": self.epoch, **last})
                bar.update(summary, tokens_run / time_run if time_run > 0 else 0.0, step=self.step,
                           elapsed=self.elapsed)  # fmt: skip
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                    self._write_eval(self.evaluate())
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self._clock(started)
                    self.checkpoint()
                if (
                    stop_after_steps is not None
                    and self.step >= stop_after_steps
                    and self.step < self.total_steps
                ):
                    log.info("stopping after optimizer step %d as asked (no final checkpoint)", self.step)
                    return self._result(last, None, tokens_run, time_run, final=False)
        finally:
            bar.close()
        if self.last_checkpoint_step != self.step:
            self._clock(started)
            self.checkpoint()
        final_eval = self.evaluate()
        self._write_eval(final_eval)
        return self._result(last, final_eval, tokens_run, time_run, final=True)

    def _clock(self, started: float) -> None:
        """Update `elapsed`: the run's training time (earlier launches included) as all processes agree."""
        self.elapsed = self._agreed(self.train_seconds + perf_counter() - started)

    def _agreed(self, elapsed: float) -> float:
        """The training time every process uses (the slowest clock), so that all stop at the same
        step and set the same learning rate. A collective only with a budget and several processes."""
        if not (self.cfg.max_seconds and self.ctx.distributed):
            return elapsed
        t = torch.tensor([elapsed], dtype=torch.float64, device=self.ctx.device)
        return float(all_reduce_max(t, self.ctx).item())

    def _write_eval(self, result: EvalRanks | None) -> None:
        if result is not None:
            self.sink.write({"split": "eval", "step": self.step, "epoch": self.epoch, **result.summary()})

    def _result(
        self, last: dict[str, Any], final_eval: EvalRanks | None, tokens: int, seconds: float, *, final: bool
    ) -> TrainResult:
        draft_dir = self.out_dir / DRAFT_DIR
        eval_summary = final_eval.summary() if final_eval is not None else None
        tps = tokens / seconds if seconds > 0 else 0.0
        trained = self.draft_cpu_copy() if final else None  # a collective under FSDP: every process gathers
        if trained is not None and self.ctx.is_main:
            with replacing_dir(draft_dir) as tmp:  # the run's own draft: replaced whole, atomically
                save_draft(trained, self.contract, tmp)
            atomic_write_json(
                self.out_dir / "train_summary.json",
                {
                    "optimizer_steps": self.step,
                    "tokens_seen": self.tokens_seen,
                    "tokens_per_s": tps,
                    "train": last,
                    "eval": eval_summary,
                    "draft": str(draft_dir),
                },
            )
        barrier(self.ctx)
        self.sink.close()
        return TrainResult(self.out_dir, draft_dir, self.step, last, eval_summary, tokens, tps)

    def draft_cpu_copy(self) -> Eagle3Draft | None:
        """The trained draft as a plain float32 CPU module on the main process (None elsewhere).
        Every process must call it: under FSDP it gathers the shards."""
        state = {
            k.removeprefix("draft."): v for k, v in get_model_state_dict(self.model, options=_FULL).items()
        }
        if not self.ctx.is_main:
            return None
        copy = Eagle3Draft(self.draft.config)
        copy.load_state_dict(state)
        return copy


def train(
    config: TrainConfig,
    draft: Eagle3Draft,
    draft_contract: Contract,
    data: RecordSource[Any],
    target_side: TargetSide,
    *,
    out_dir: Path,
    eval_data: RecordSource[Any] | None = None,
    resume: bool = False,
    stop_after_steps: int | None = None,
    progress: bool = True,
    ctx: DistContext | None = None,
) -> TrainResult:
    """Train `draft` (modified in place) on `data`; everything lands in `out_dir`.

    data: records (TokenizedRecord for an OnlineTarget, CapturedRecord for an OfflineTarget);
    eval_data: held-out records of the same kind, evaluated every `config.eval_every` steps and at
    the end. `stop_after_steps` returns early *without* a final checkpoint (as an interrupted run
    would); `resume=True` continues from `out_dir/latest.json`.
    """
    ctx = ctx or init_distributed()
    trainer = Trainer(
        config,
        draft,
        draft_contract,
        data,
        target_side,
        out_dir=Path(out_dir),
        eval_data=eval_data,
        resume=resume,
        ctx=ctx,
    )
    return trainer.run(stop_after_steps=stop_after_steps, progress=progress)
