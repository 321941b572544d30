"""`eaglewire train`: train an EAGLE-3 draft online (tokenized dataset) or offline (hidden-state shards).

Multi-GPU: `torchrun --nproc_per_node N $(which eaglewire) train ...` (DDP; `--parallel fsdp` for FSDP2).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from eaglewire.cli.common import (
    DEVICE_HELP,
    parse_int_list,
    parse_source_repeats,
    print_json,
    print_table,
    resolve_device,
)
from eaglewire.cli.flags import at_least, bare_message, one_of, rename_fields
from eaglewire.errors import ConfigError

if TYPE_CHECKING:
    from eaglewire.train.config import TrainConfig

# CLI flag -> TrainConfig field. Only flags given on the command line override the config.
_OVERRIDES = {
    "ttt_steps": "ttt_steps",
    "hard_label_weight": "hard_label_weight",
    "align_topk": "align_topk",
    "epochs": "epochs",
    "max_steps": "max_steps",
    "batch_size": "batch_size",
    "grad_accum_steps": "grad_accum_steps",
    "max_length": "max_length",
    "learning_rate": "learning_rate",
    "warmup_ratio": "warmup_ratio",
    "eval_every": "eval_every",
    "eval_max_records": "eval_max_records",
    "checkpoint_every": "checkpoint_every",
    "seed": "seed",
    "precision": "precision",
    "parallel": "parallel",
    "tensorboard": "tensorboard",
    "pack": "pack",
    "compile": "compile",
    "ttt_attention": "ttt_attention",
}


def flag_of(field: str) -> str:
    """The `train` flag that sets TrainConfig `field` (`ttt_steps` -> `--ttt-steps`)."""
    return "--" + field.replace("_", "-")


def config_with_flags(base: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """`base` with the flags' values; a refusal names the flags it came from (`--precision: expected
    one of auto, bf16, fp32, got 'fp8'`), and the config file's fields by their JSON names."""
    try:
        return replace(base, **overrides)
    except ConfigError as e:
        names = {field: flag_of(field) for field in overrides}
        raise ConfigError(
            rename_fields(bare_message(e), names),
            fix=None if e.fix is None else rename_fields(e.fix, names),
        ) from None


def train_command(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    data: Path = typer.Option(..., "--data", help="tokenized dataset (online) or shard directory (offline)"),
    out: Path = typer.Option(..., "--out", help="run directory: checkpoints, metrics.jsonl, draft/"),
    draft_init: Path = typer.Option(
        None, "--draft-init", help="start from this draft (`eaglewire draft init`)"
    ),
    eval_data: Path = typer.Option(
        None, "--eval-data", help="held-out data of the same kind, evaluated during training"
    ),
    resume: bool = typer.Option(
        False, "--resume", help="continue the run in --out from its latest checkpoint"
    ),
    config: Path = typer.Option(None, "--config", help="TrainConfig JSON (flags below override it)"),
    aux_boundaries: str = typer.Option(None, "--aux-boundaries", help="without --draft-init: aux boundaries"),
    vocab_map: Path = typer.Option(
        None, "--vocab-map", help="without --draft-init: `eaglewire data vocab` output"
    ),
    draft_intermediate_size: int = typer.Option(
        None,
        "--draft-intermediate-size",
        help="without --draft-init: the draft layer's MLP width (default: the target's)",
    ),
    ttt_steps: int = typer.Option(None, "--ttt-steps", help="unrolled steps S (default 7)"),
    hard_label_weight: float = typer.Option(
        None,
        "--hard-label-weight",
        help="share of the label on the target's argmax token, 0..1 (default 0: soft labels)",
    ),
    align_topk: int = typer.Option(
        None,
        "--align-topk",
        help="train step s only where the target's token was in the draft's top-k at every earlier "
        "step (1 for chains; default 0: every row)",
    ),
    epochs: int = typer.Option(None, "--epochs"),
    source_repeats: str = typer.Option(
        None,
        "--source-repeats",
        help="weigh the data mix: 'SOURCE:N,...' (SOURCE = a record id's prefix before ':', e.g. "
        "chitchat:2,humaneval:4): each epoch holds those records N times",
    ),
    max_steps: int = typer.Option(None, "--max-steps", help="cap on optimizer steps (0 = epochs decide)"),
    batch_size: int = typer.Option(None, "--batch-size", help="rows per micro-batch per process"),
    grad_accum_steps: int = typer.Option(None, "--grad-accum-steps"),
    max_length: int = typer.Option(None, "--max-length", help="tokens per row"),
    learning_rate: float = typer.Option(None, "--learning-rate"),
    warmup_ratio: float = typer.Option(None, "--warmup-ratio"),
    eval_every: int = typer.Option(None, "--eval-every", help="optimizer steps between evaluations"),
    eval_max_records: int = typer.Option(None, "--eval-max-records"),
    checkpoint_every: int = typer.Option(None, "--checkpoint-every"),
    seed: int = typer.Option(None, "--seed"),
    precision: str = typer.Option(None, "--precision", help="auto | bf16 | fp32"),
    parallel: str = typer.Option(None, "--parallel", help="ddp | fsdp (under torchrun)"),
    tensorboard: bool = typer.Option(None, "--tensorboard/--no-tensorboard"),
    pack: bool = typer.Option(None, "--pack/--no-pack", help="pack several records per row"),
    compile: bool = typer.Option(
        None, "--compile/--no-compile", help="torch.compile the draft's forward (dynamic shapes)"
    ),
    ttt_attention: str = typer.Option(
        None,
        "--ttt-attention",
        help="blocked | flex: how the training-time test's attention runs (flex: block-sparse, CUDA only)",
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    target_dtype: str = typer.Option(
        None, "--target-dtype", help="dtype of the online target (default bf16 on GPU)"
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Train a draft; everything lands in --out (draft in --out/draft, metrics in --out/metrics.jsonl)."""
    from eaglewire.train.config import TRAIN_CONFIG_FILE, TrainConfig  # no torch: flags are checked first

    given = locals()
    from eaglewire.output_marker import OutputKind
    from eaglewire.outputs import check_resumable_dir

    check_resumable_dir(out, OutputKind.TRAIN_RUN)  # a directory of anything else is refused before any work
    if resume and (out / TRAIN_CONFIG_FILE).exists():
        base = TrainConfig.load(out)
    elif config is not None:
        base = TrainConfig.load(config)
    else:
        base = TrainConfig()
    overrides: dict[str, Any] = {
        field: given[flag] for flag, field in _OVERRIDES.items() if given[flag] is not None
    }
    if source_repeats is not None:
        overrides["source_repeats"] = parse_source_repeats(source_repeats)
    cfg = config_with_flags(base, overrides)
    at_least("--draft-intermediate-size", draft_intermediate_size, 1, "the draft layer's MLP width")
    one_of("--target-dtype", target_dtype, ("float32", "bfloat16", "float16"))
    from eaglewire.train.distributed import init_distributed, shutdown_distributed
    from eaglewire.train.run import run_training

    d2t = None
    if vocab_map is not None:
        from eaglewire.data.vocab import load_draft_vocab

        d2t = load_draft_vocab(vocab_map, flag="--vocab-map").draft_to_target
    ctx = init_distributed(resolve_device(device))  # cuda -> cuda:LOCAL_RANK under torchrun
    try:
        result = run_training(
            target=target,
            data_dir=data,
            out_dir=out,
            config=cfg,
            draft_init=draft_init,
            eval_dir=eval_data,
            resume=resume,
            aux_boundaries=parse_int_list(aux_boundaries, what="--aux-boundaries"),
            draft_to_target=d2t,
            draft_intermediate_size=draft_intermediate_size,
            target_dtype=target_dtype,
            progress=progress,
            ctx=ctx,
        )
    except BaseException:
        shutdown_distributed(wait_for_peers=False)
        raise
    shutdown_distributed()
    if not ctx.is_main:
        return
    report = {
        "out": str(result.out_dir),
        "draft": str(result.draft_dir),
        "optimizer_steps": result.optimizer_steps,
        "tokens_per_s": result.tokens_per_s,
        "train": result.train,
        "eval": result.eval,
    }
    if json_out:
        print_json(report)
        return
    rows: list[list[Any]] = [
        ["optimizer steps", result.optimizer_steps],
        ["tokens/s (train)", f"{result.tokens_per_s:,.0f}"],
    ]
    for name, summary in (("train (last step)", result.train), ("eval", result.eval)):
        if summary:
            rows.append([f"{name} loss", f"{summary['loss']:.4f}"])
            rows.append([f"{name} acc per step", " ".join(f"{a:.3f}" for a in summary["acc"])])
            rows.append([f"{name} cond acc per step", " ".join(f"{a:.3f}" for a in summary["cond_acc"])])
    rows.append(["draft", str(result.draft_dir)])
    print_table(f"training done: {result.out_dir}", ["", "value"], rows)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
