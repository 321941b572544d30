"""`eaglewire quickstart`: the whole pipeline on the reference target, with a summary at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from eaglewire.cli.common import console, parse_source_repeats, print_json, print_table
from eaglewire.recipes.resume import STAGES


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


def show_summary(summary: dict[str, Any]) -> None:
    rows = []
    for prompt_set, methods in summary["decode"].items():
        for method, r in methods.items():
            same = r.get("identical_to_plain")
            rows.append(
                [
                    prompt_set,
                    method,
                    _fmt(r["tokens_per_s"], ".1f"),
                    _fmt(r["tau"]),
                    _fmt(r.get("served_predicted_tau")),
                    _fmt(r["speedup_vs_plain"]),
                    _fmt(r.get("decode_speedup_vs_plain")),
                    # a resumed older run's decode.json has the former key: all at near-ties
                    _same(same, r.get("differences_explained", r.get("differences_at_near_ties"))),
                ]
            )
    print_table(
        "quickstart: held-out decoding (greedy)",
        ["prompts", "method", "tok/s", "tau", "pred", "speedup", "decode", "same"],
        rows,
        caption="pred: tau predicted offline on the served text; decode: the decode-only speedup; "
        "same: greedy text equal to plain (ties: it parts only where the target's two best tokens "
        "are nearly tied, the dtype's rounding, or where plain's own decode drifted from the target's "
        "forward; NO: the target clearly prefers plain's token there, a bug in this method)",
    )
    # how the tree's held-out tau was predicted (`predict.predictor`); older run directories say nothing
    how = summary.get("heldout_prediction_method", {}).get("eagle-tree")
    tree_method = f", {how}" if how else ""
    print_table(
        "quickstart: stages",
        ["stage", "seconds"],
        [[k, _fmt(v, ".0f")] for k, v in summary["stage_seconds"].items()]
        + [
            ["predicted tau (chain, held-out)", _fmt(summary["predicted_tau_chain"])],
            # what a benchmark prompt gets; "-" for older (resumed) run directories
            [
                "predicted tau (chain, held-out first answers)",
                _fmt(summary.get("predicted_tau_chain_first_answers")),
            ],
            # older run directories (resumed) have no tree prediction: "-"
            [
                f"predicted tau (tree, held-out first answers{tree_method})",
                _fmt(summary.get("heldout_predicted_tau", {}).get("eagle-tree")),
            ],
            ["doctor on exports", "no findings" if summary["doctor_ok"] else "FINDINGS (see doctor.json)"],
        ],
    )


def quickstart(
    preset: str = typer.Option(
        None, "--preset", help="cpu | gpu (default: gpu when CUDA is available, else cpu)"
    ),
    out: Path = typer.Option(Path("runs/quickstart"), "--out", help="run directory (rerun to resume)"),
    target: str = typer.Option("smollm2", "--target", help="target to run the recipe on"),
    chitchat: int = typer.Option(None, "--chitchat", help="override: training conversations from chitchat"),
    user_turns: int = typer.Option(
        None,
        "--user-turns",
        help="override: user turns kept per chitchat conversation (1 = first answers only)",
    ),
    magpie: int = typer.Option(
        None, "--magpie", help="override: prompts sampled from the target itself (Magpie) for training"
    ),
    magpie_opened_fraction: float = typer.Option(
        None,
        "--magpie-opened-fraction",
        help="override: share of the Magpie prompts started with an instruction opening ('Write', 'Solve', ...)",
    ),
    draft_vocab_size: int = typer.Option(
        None, "--draft-vocab-size", help="override: Vd, the draft's vocabulary (by frequency in the answers)"
    ),
    draft_intermediate_size: int = typer.Option(
        None, "--draft-intermediate-size", help="override: the draft layer's MLP width (0 = the target's)"
    ),
    hard_label_weight: float = typer.Option(
        None,
        "--hard-label-weight",
        help="override: share of the training label on the target's argmax token (0 = soft labels)",
    ),
    epochs: int = typer.Option(None, "--epochs", help="override: training epochs"),
    batch_size: int = typer.Option(None, "--batch-size", help="override: training rows per optimizer step"),
    learning_rate: float = typer.Option(
        None, "--learning-rate", help="override: peak training learning rate"
    ),
    ttt_steps: int = typer.Option(
        None,
        "--ttt-steps",
        help="override: unrolled training-time-test steps S (the gpu preset trains 4, the cpu preset 2: in "
        "the same time fewer steps buy more optimizer steps)",
    ),
    regen_max_seconds: float = typer.Option(
        None, "--regen-max-seconds", help="override: regeneration time budget in seconds (0 = no budget)"
    ),
    train_max_seconds: float = typer.Option(
        None, "--train-max-seconds", help="override: training time budget in seconds (0 = epochs decide)"
    ),
    regen_max_new_tokens: int = typer.Option(
        None,
        "--regen-max-new-tokens",
        help="override: the longest regenerated answer in tokens (the gpu preset cuts about half its answers at 256)",
    ),
    regen_continuous: bool = typer.Option(
        None,
        "--regen-continuous/--regen-batched",
        help="override: refill generation rows as answers finish (continuous batching) or run batches to their end",
    ),
    source_repeats: str = typer.Option(
        None,
        "--source-repeats",
        help="override: weigh the training data's sources, 'SOURCE:N,...' (e.g. chitchat:2,humaneval:4; "
        "each epoch holds those records N times)",
    ),
    regen_rows: int = typer.Option(
        None,
        "--regen-rows",
        help="override: the most rows one generation forward runs in regeneration and Magpie sampling "
        "(0 = the engine's default)",
    ),
    train_compile: bool = typer.Option(
        None,
        "--train-compile/--train-eager",
        help="override: torch.compile the draft's forward in training, or run it eagerly",
    ),
    train_ttt_attention: str = typer.Option(
        None,
        "--train-ttt-attention",
        help="override: blocked | flex, how the training-time test's attention runs (flex: CUDA only)",
    ),
    train_from_shards: bool = typer.Option(
        None,
        "--train-from-shards/--train-online",
        help="override: capture the training data's hidden states to shards once and train from them, "
        "or run the target inside every training step",
    ),
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
) -> None:
    """Fresh machine -> reference target -> data -> train -> eval -> decode -> export -> doctor."""
    import torch

    from eaglewire.recipes.presets import get_preset
    from eaglewire.recipes.quickstart import QuickstartRun, run_quickstart

    name = preset or ("gpu" if torch.cuda.is_available() else "cpu")
    chosen = get_preset(
        name,
        chitchat_conversations=chitchat,
        user_turns=user_turns,
        magpie_prompts=magpie,
        magpie_opened_fraction=magpie_opened_fraction,
        draft_vocab_size=draft_vocab_size,
        draft_intermediate_size=draft_intermediate_size,
        hard_label_weight=hard_label_weight,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        ttt_steps=ttt_steps,
        regen_max_seconds=regen_max_seconds,
        regen_max_new_tokens=regen_max_new_tokens,
        train_max_seconds=train_max_seconds,
        regen_continuous=regen_continuous,
        regen_rows=regen_rows,
        source_repeats=parse_source_repeats(source_repeats),
        train_compile=train_compile,
        train_ttt_attention=train_ttt_attention,
        train_from_shards=train_from_shards,
        hf_baseline_sets=() if skip_hf_baselines else None,
    )
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
        print_json(summary)
    elif "stopped_after" in summary:
        console.print(
            f"stopped after stage {summary['stopped_after']} (--stop-after); rerun without it to go on"
        )
    else:
        show_summary(summary)


def register(app: typer.Typer) -> None:
    app.command("quickstart")(quickstart)
