"""The training run's configuration: one frozen dataclass, saved as `train_config.json` in the run dir.

Everything that changes what a run computes lives here (so a resumed run can prove it continues
the same run); things that only change how it is watched (progress bar, where to stop early) are
arguments of `eaglewire.train.loop.train`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.typed_config import from_dict, help_field, read_json_file, to_dict

TRAIN_CONFIG_FILE = "train_config.json"

LossKind = Literal["soft_ce", "kl"]
Precision = Literal["auto", "bf16", "fp32"]
Parallel = Literal["ddp", "fsdp"]
TTTAttention = Literal["blocked", "flex"]


@dataclass(frozen=True)
class TrainConfig:
    # --- training-time test ---
    ttt_steps: int = help_field(
        "S: unrolled draft steps per position (the draft feeds itself S-1 times)", default=7
    )
    step_weight_decay: float = help_field(
        "loss weight of step s is step_weight_decay**s (EAGLE-3: 0.8)", default=0.8
    )
    loss: LossKind = help_field(
        "'soft_ce': cross-entropy against the target's distribution restricted to the draft vocab; "
        "'kl': the same minus the target entropy (same gradient, reaches 0 at a perfect match)",
        default="soft_ce",
    )
    hard_label_weight: float = help_field(
        "w in 0..1: the label is (1 - w) * the target's distribution + w * a one-hot on its argmax "
        "token. 0 = EAGLE-3's soft labels; greedy serving accepts exactly the argmax, and w = 1 trains "
        "the draft's probabilities to be the chance that a token is that argmax. Measured on the H200 "
        "(docs/history/benchmarks-log.md §2j): w = 1 left greedy chains where they were and shortened "
        "trees, whose other branches draft the target's second choices",
        default=0.0,
    )
    align_topk: int = help_field(
        "k >= 1: train step s only on the rows a served draft reaches, those whose target token was "
        "in the draft's top-k at every earlier step (GRIFFIN's token alignment; 1 = a chain, a tree's "
        "topk for trees); the normaliser stays every valid row, so later steps weigh by how often "
        "serving gets there. 0 = every valid row at every step (EAGLE-3)",
        default=0,
    )
    # --- optimisation ---
    learning_rate: float = help_field("peak AdamW learning rate", default=1e-4)
    min_lr_ratio: float = help_field("cosine decays to learning_rate*min_lr_ratio", default=0.0)
    warmup_ratio: float = help_field("fraction of optimizer steps with linear warmup from 0", default=0.02)
    weight_decay: float = help_field("AdamW decoupled weight decay", default=0.0)
    adam_beta1: float = help_field("AdamW beta1", default=0.9)
    adam_beta2: float = help_field("AdamW beta2", default=0.95)
    adam_eps: float = help_field("AdamW epsilon", default=1e-8)
    max_grad_norm: float = help_field(
        "clip the global gradient norm to this; 0 disables clipping", default=0.5
    )
    train_embeddings: bool = help_field(
        "also train embed_tokens (copied from the target; frozen by default)", default=False
    )
    # --- batching ---
    max_length: int = help_field("tokens per row; longer records are truncated (and counted)", default=2048)
    pack: bool = help_field(
        "pack several records into one row (attention never crosses records)", default=True
    )
    batch_size: int = help_field("rows per micro-batch per process", default=1)
    grad_accum_steps: int = help_field("micro-batches per optimizer step per process", default=1)
    epochs: int = help_field("passes over the training records", default=1)
    source_repeats: tuple[str, ...] = help_field(
        "'SOURCE:N' entries: every epoch holds each record of SOURCE (its id's prefix before ':', e.g. "
        "'chitchat' or 'humaneval') N times, shuffled like the rest; unnamed sources once. Weights the "
        "data mix without writing records twice",
        default=(),
    )
    max_steps: int = help_field("stop after this many optimizer steps; 0 = epochs decide", default=0)
    max_seconds: float = help_field(
        "wall-time budget of the training loop, resumes included: stop after the optimizer step that "
        "passes it (the run still ends with a checkpoint, evaluation and the draft); the warmup and "
        "cosine then follow whichever of steps and time is further along, so a run cut by the budget "
        "ends at the low learning rate; 0 = none (the schedule follows the steps alone)",
        default=0.0,
    )
    # --- evaluation, checkpoints, logging ---
    eval_every: int = help_field(
        "optimizer steps between held-out evaluations; 0 = only at the end", default=0
    )
    eval_max_records: int = help_field("evaluate on at most this many held-out records; 0 = all", default=0)
    checkpoint_every: int = help_field("optimizer steps between checkpoints; 0 = only at the end", default=0)
    keep_checkpoints: int = help_field("how many recent checkpoints to keep on disk", default=2)
    log_every: int = help_field("optimizer steps between metrics lines", default=1)
    tensorboard: bool = help_field(
        "also write TensorBoard event files (needs the tensorboard package)", default=False
    )
    # --- runtime ---
    seed: int = help_field("seed for the shuffling order and any randomness", default=0)
    precision: Precision = help_field("'auto' = bf16 autocast on CUDA, fp32 on CPU", default="auto")
    parallel: Parallel = help_field(
        "multi-process strategy under torchrun: 'ddp' or 'fsdp' (FSDP2)", default="ddp"
    )
    compile: bool = help_field(
        "torch.compile the draft's forward inside the training-time test (dynamic shapes): fewer "
        "kernel launches per step; the first steps compile (benchmarks/train_profile.py measures it)",
        default=False,
    )
    ttt_attention: TTTAttention = help_field(
        "how the training-time test's attention runs (the same mask and math): 'blocked' = fused SDPA "
        "over row blocks (any device), 'flex' = block-sparse FlexAttention that skips other records' "
        "rows (CUDA only: no CPU backward); benchmarks/ttt_attention_speed.py compares them",
        default="blocked",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name}: expected a finite number, got {value}")
        positive = (
            "ttt_steps",
            "max_length",
            "batch_size",
            "grad_accum_steps",
            "epochs",
            "log_every",
            "keep_checkpoints",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.max_seconds < 0:
            raise ConfigError(f"max_seconds: expected >= 0 (0 = no budget), got {self.max_seconds}")
        for name in ("max_steps", "eval_every", "eval_max_records", "checkpoint_every", "align_topk"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected an integer >= 0, got {getattr(self, name)}")
        self.repeats_by_source()  # checks every entry
        if not 0.0 < self.step_weight_decay <= 1.0:
            raise ConfigError(f"step_weight_decay: expected 0 < value <= 1, got {self.step_weight_decay}")
        if not 0.0 <= self.hard_label_weight <= 1.0:
            raise ConfigError(f"hard_label_weight: expected 0 <= value <= 1, got {self.hard_label_weight}")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate: expected > 0, got {self.learning_rate}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio: expected 0..1, got {self.min_lr_ratio}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio: expected 0 <= value < 1, got {self.warmup_ratio}")
        if self.max_grad_norm < 0:
            raise ConfigError(f"max_grad_norm: expected >= 0 (0 disables clipping), got {self.max_grad_norm}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}: expected 0 <= value < 1, got {getattr(self, name)}")
        for name, kind in (
            ("loss", LossKind),
            ("precision", Precision),
            ("parallel", Parallel),
            ("ttt_attention", TTTAttention),
        ):
            if getattr(self, name) not in typing.get_args(kind):
                raise ConfigError(
                    f"{name}: expected one of {', '.join(typing.get_args(kind))}, got {getattr(self, name)!r}"
                )
        if self.compile and self.parallel == "fsdp":
            raise ConfigError(
                "compile=True with parallel='fsdp': the compiled draft forward would bypass FSDP's "
                "per-module hooks",
                fix="use parallel='ddp' with compile, or compile=False with FSDP",
            )
        if self.max_length < self.ttt_steps + 2:
            raise ConfigError(
                f"max_length={self.max_length} is too short for ttt_steps={self.ttt_steps}: "
                f"step s at position t predicts token t+2+s, so rows need at least ttt_steps+2 tokens"
            )

    def repeats_by_source(self) -> dict[str, int]:
        """source_repeats as {source: N}; a malformed or repeated entry is refused by name."""
        out: dict[str, int] = {}
        for entry in self.source_repeats:
            source, sep, count = entry.rpartition(":")
            if not sep or not source or not count.isdigit() or int(count) < 1:
                raise ConfigError(f"source_repeats: expected 'SOURCE:N' with N >= 1, got {entry!r}")
            if source in out:
                raise ConfigError(f"source_repeats: {source!r} named twice ({list(self.source_repeats)})")
            out[source] = int(count)
        return out

    def step_weights(self) -> list[float]:
        """[S] loss weight of each unrolled step."""
        return [self.step_weight_decay**s for s in range(self.ttt_steps)]

    # --- JSON ---
    def save(self, directory: Path) -> Path:
        path = Path(directory) / TRAIN_CONFIG_FILE
        atomic_write_json(path, to_dict(self))
        return path

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        path = Path(path)
        if path.is_dir():
            path = path / TRAIN_CONFIG_FILE
        return from_dict(cls, read_json_file(path), where=str(path))

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str = TRAIN_CONFIG_FILE) -> TrainConfig:
        return from_dict(cls, data, where=where)


# Fields a resumed run may change: they steer logging, evaluation and checkpoint cadence, not the weights.
RESUME_MUTABLE = frozenset(
    {
        "eval_every",
        "eval_max_records",
        "checkpoint_every",
        "keep_checkpoints",
        "log_every",
        "tensorboard",
        "compile",  # how the same forward runs
        "ttt_attention",  # likewise
    }
)


def config_diff(
    a: TrainConfig,
    b: TrainConfig,
    *,
    names: tuple[str, str] = ("a", "b"),
    ignore: frozenset[str] = frozenset(),
) -> list[str]:
    """'field: a=.. b=..' for every field that differs (except those in `ignore`)."""
    return [
        f"{f.name}: {names[0]}={getattr(a, f.name)!r} {names[1]}={getattr(b, f.name)!r}"
        for f in fields(TrainConfig)
        if f.name not in ignore and getattr(a, f.name) != getattr(b, f.name)
    ]
