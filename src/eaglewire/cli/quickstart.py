"""`eaglewire quickstart`: the whole pipeline on the reference target, with a summary at the end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from eaglewire.cli.common import console, parse_source_repeats, print_json, print_table
from eaglewire.cli.config_options import ConfigOptions, FieldOption, field_value
from eaglewire.recipes.presets import PRESETS, QuickstartPreset
from eaglewire.recipes.resume import STAGES

if TYPE_CHECKING:
    from eaglewire.recipes.results import QuickstartSummary

# The preset values `quickstart` overrides from flags: type and help come from the preset's field,
# each help ends with the presets' own values.
QUICKSTART_OPTIONS = ConfigOptions(
    QuickstartPreset,
    [
        FieldOption("data.chitchat_conversations", "--chitchat"),
        FieldOption("data.user_turns"),
        FieldOption("data.magpie_prompts", "--magpie"),
        FieldOption("data.magpie_opened_fraction"),
        FieldOption("data.draft_vocab_size"),
        FieldOption("draft_intermediate_size"),
        FieldOption("train.hard_label_weight"),
        FieldOption("train.epochs"),
        FieldOption("train.batch_size"),
        FieldOption("train.learning_rate"),
        FieldOption("train.ttt_steps"),
        FieldOption("data.regen_max_seconds"),
        FieldOption("train.max_seconds", "--train-max-seconds"),
        FieldOption("data.regen_max_new_tokens"),
        FieldOption("data.regen_continuous", "--regen-continuous/--regen-batched"),
        FieldOption("train.source_repeats", parse=parse_source_repeats),
        FieldOption("data.regen_rows"),
        FieldOption("train.compile", "--train-compile/--train-eager"),
        FieldOption("train.ttt_attention", "--train-ttt-attention"),
        FieldOption("data.train_from_shards", "--train-from-shards/--train-online"),
        FieldOption("train.max_length", "--train-max-length"),
        FieldOption("data.regen_max_prompt_tokens"),
        FieldOption("data.long_conversations"),
        FieldOption("data.long_documents"),
        FieldOption("data.long_user_turns"),
        FieldOption("data.long_max_tokens"),
        FieldOption("data.long_regen_batch_size"),
        FieldOption("data.long_regen_max_seconds"),
    ],
    help_prefix="override: ",
    help_suffix=lambda path: (
        f" (presets: {', '.join(f'{n} {_shown(field_value(p, path))}' for n, p in PRESETS.items())})"
    ),
)


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return (
        str(value).lower()
        if isinstance(value, bool)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def show_target_report(report: Any) -> None:
    c = report.contract
    print_table(
        f"contract: {c.target.architecture}, L={c.target.num_layers}, Ht={c.target.hidden_size}, V={c.target.vocab_size}",
        ["field", "value"],
        [["aux", line] for line in c.describe()[: c.num_aux]]
        + [["final", c.describe()[-1]], ["dtype", c.dtype]],
    )
    print_table(
        "aux layer ids to write per engine",
        ["engine / tool", "ids"],
        [[k, ",".join(map(str, v)) if isinstance(v, tuple) else v] for k, v in report.engine_ids.items()],
    )


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _same(identical: bool | None, explained: bool | None) -> str:
    """explained: every difference is rounding or the reference's drift (not this method's bug)."""
    if identical is None:
        return "-"
    if identical:
        return "yes"
    return "ties" if explained else "NO"


def show_summary(summary: QuickstartSummary) -> None:
    rows = []
    kinds = summary.prompt_set_kind  # older (resumed) run directories have none
    for prompt_set, methods in ({} if summary.decode is None else summary.decode.sets).items():
        for i, (method, r) in enumerate(methods.items()):
            rows.append(
                [
                    prompt_set,
                    kinds.get(prompt_set, "") if i == 0 else "",
                    method,
                    _fmt(r.tokens_per_s, ".1f"),
                    _fmt(r.tau),
                    _fmt(None if r.served is None else r.served.predicted_tau),
                    _fmt(r.speedup_vs_plain),
                    _fmt(r.decode_speedup_vs_plain),
                    _same(r.identical_to_plain, r.differences_explained),
                ]
            )
    print_table(
        "quickstart: held-out decoding (greedy)",
        ["prompts", "kind", "method", "tok/s", "tau", "pred", "speedup", "decode", "same"],
        rows,
        caption="kind: user-like prompts (the headline) or held out of the training sets' own distribution "
        "(in-distribution held-out: their tau overstates a user's); "
        "pred: tau predicted offline on the served text; decode: the decode-only speedup; "
        "same: greedy text equal to plain (ties: it parts only where the target's two best tokens "
        "are nearly tied, the dtype's rounding, or where plain's own decode drifted from the target's "
        "forward; NO: the target clearly prefers plain's token there, a bug in this method)",
    )
    # how the tree's held-out tau was predicted (`predict.predictor`); older run directories say nothing
    how = summary.heldout_prediction_method.get("eagle-tree")
    tree_method = f", {how}" if how else ""
    print_table(
        "quickstart: stages",
        ["stage", "seconds"],
        [[k, _fmt(v, ".0f")] for k, v in summary.stage_seconds.items()]
        + [
            ["predicted tau (chain, held-out)", _fmt(summary.predicted_tau_chain)],
            # what a benchmark prompt gets; "-" for older (resumed) run directories
            [
                "predicted tau (chain, held-out first answers)",
                _fmt(summary.predicted_tau_chain_first_answers),
            ],
            # older run directories (resumed) have no tree prediction: "-"
            [
                f"predicted tau (tree, held-out first answers{tree_method})",
                _fmt(summary.heldout_predicted_tau.get("eagle-tree")),
            ],
            ["doctor on exports", "no findings" if summary.doctor_ok else "FINDINGS (see doctor.json)"],
        ],
    )


@QUICKSTART_OPTIONS.add_to(before="skip_hf_baselines")
def quickstart(
    preset: str = typer.Option(
        None, "--preset", help="cpu | gpu (default: gpu when CUDA is available, else cpu)"
    ),
    out: Path = typer.Option(Path("runs/quickstart"), "--out", help="run directory (rerun to resume)"),
    target: str = typer.Option("smollm2", "--target", help="target to run the recipe on"),
    skip_hf_baselines: bool = typer.Option(
        False,
        "--skip-hf-baselines",
        help="leave out the transformers baselines (generate, prompt lookup, compiled static cache): "
        "they do not depend on the draft, and on the H200 they take ~3 of the decode stage's ~7 minutes",
    ),
    stop_after: str = typer.Option(
        None,
        "--stop-after",
        help="the last stage to run (target | data | train | eval | decode | export | doctor); rerun "
        "without it to go on from there",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    **options: Any,
) -> None:
    """Fresh machine -> reference target -> data -> train -> eval -> decode -> export -> doctor."""
    import torch

    from eaglewire.recipes.presets import get_preset
    from eaglewire.recipes.quickstart import QuickstartRun, run_quickstart

    name = preset or ("gpu" if torch.cuda.is_available() else "cpu")
    overrides = QUICKSTART_OPTIONS.given(options)
    if skip_hf_baselines:
        overrides["decode.hf_baseline_sets"] = ()
    chosen = get_preset(name, overrides)
    out_dir = out / chosen.name
    console.print(f"[bold]eaglewire quickstart[/] preset={chosen.name} target={target} -> {out_dir}")

    def announce(stage: str) -> None:
        console.print(f"[bold cyan]stage {STAGES.index(stage) + 1}/{len(STAGES)}: {stage}[/]")

    run = QuickstartRun(
        preset=chosen, out_dir=out_dir, target=target, on_stage=announce, on_target_report=show_target_report,
        stop_after=stop_after,
    )  # fmt: skip
    summary = run_quickstart(run)
    if as_json:
        print_json(summary.to_json())
    elif summary.stopped_after is not None:
        console.print(
            f"stopped after stage {summary.stopped_after} (--stop-after); rerun without it to go on"
        )
    else:
        show_summary(summary)


def register(app: typer.Typer) -> None:
    app.command("quickstart")(quickstart)
