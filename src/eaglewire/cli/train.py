"""`eaglewire train`: train an EAGLE-3 draft online (tokenized dataset) or offline (hidden-state shards).

Multi-GPU: `torchrun --nproc_per_node N $(which eaglewire) train ...` (DDP; `--parallel fsdp` for FSDP2;
docs/multi-gpu.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from eaglewire.cli.common import (
    DEVICE_HELP,
    parse_int_list,
    parse_source_repeats,
    print_json,
    print_table,
    resolve_device,
)
from eaglewire.cli.config_options import ConfigOptions, FieldOption, field_value
from eaglewire.cli.flags import bare_message, check_draft_mlp, draft_mlp_option, one_of, rename_fields
from eaglewire.errors import ConfigError
from eaglewire.train.config import TRAIN_CONFIG_FILE, TrainConfig  # no torch: a dataclass module

# The TrainConfig fields `train` sets from flags (`--ttt-steps`, `--pack/--no-pack`): type, help and
# default come from the field; only flags given on the command line override the config.
TRAIN_OPTIONS = ConfigOptions(
    TrainConfig,
    [
        FieldOption("ttt_steps"),
        FieldOption("hard_label_weight"),
        FieldOption("align_topk"),
        FieldOption("epochs"),
        FieldOption("source_repeats", parse=parse_source_repeats),
        FieldOption("max_steps"),
        FieldOption("batch_size"),
        FieldOption("grad_accum_steps"),
        FieldOption("max_length"),
        FieldOption("learning_rate"),
        FieldOption("warmup_ratio"),
        FieldOption("eval_every"),
        FieldOption("eval_max_records"),
        FieldOption("checkpoint_every"),
        FieldOption("seed"),
        FieldOption("precision"),
        FieldOption("parallel"),
        FieldOption("tensorboard"),
        FieldOption("pack"),
        FieldOption("compile"),
        FieldOption("ttt_attention"),
    ],
    help_suffix=lambda path: f" (default: {_shown(field_value(TrainConfig(), path))})",
)


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


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


@TRAIN_OPTIONS.add_to(before="device")
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
    draft_intermediate_size: int = draft_mlp_option("without --draft-init: "),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    target_dtype: str = typer.Option(
        None, "--target-dtype", help="dtype of the online target (default bf16 on GPU)"
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
    **options: Any,
) -> None:
    """Train a draft; everything lands in --out (draft in --out/draft, metrics in --out/metrics.jsonl)."""
    from eaglewire.output_marker import OutputKind
    from eaglewire.outputs import check_resumable_dir

    check_resumable_dir(out, OutputKind.TRAIN_RUN)  # a directory of anything else is refused before any work
    if resume and (out / TRAIN_CONFIG_FILE).exists():
        base = TrainConfig.load(out)
    elif config is not None:
        base = TrainConfig.load(config)
    else:
        base = TrainConfig()
    cfg = config_with_flags(base, TRAIN_OPTIONS.given(options))
    check_draft_mlp(draft_intermediate_size)
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
