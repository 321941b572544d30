"""`eaglewire eval`: offline per-step accuracy and predicted acceptance length of a trained draft."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from eaglewire.cli.common import DEVICE_HELP, print_json, print_table, resolve_device

if TYPE_CHECKING:
    from eaglewire.engine.spec_args import SpecArgs
    from eaglewire.predict.evaluation import EvalResult
    from eaglewire.target.loading import LoadedTarget

TREE_HELP = (
    "also predict tau for a tree: 'NUM_STEPS,TOPK,NUM_DRAFT_TOKENS' (the engine's dynamic tree of those "
    "SGLang settings, e.g. 8,8,128, decoded by the engine's drafter over the held-out answers), "
    "'TOPKxDEPTH' (a static full tree, e.g. 2x3) or a JSON file listing static nodes as rank paths, "
    "e.g. [[0],[1],[0,0]]"
)


# The deepest chain or tree `eval` predicts. A chain's predicted tau is the product of per-step
# accuracies: past 32 steps nothing measurable is left (the deepest --speculative-num-steps served in
# practice is ~10), while each step costs one more draft forward over every record and needs rows of
# at least steps + 2 tokens (step s at position t predicts token t+2+s).
MAX_EVAL_STEPS = 32
TARGET_DTYPES = ("float32", "bfloat16", "float16")


def _parse_tree(text: str) -> list[tuple[int, ...]] | SpecArgs:
    """Static nodes (a JSON file or TOPKxDEPTH), or the engine setting NUM_STEPS,TOPK,NUM_DRAFT_TOKENS.
    Checked here, before any work: no torch."""
    from itertools import product

    from eaglewire.cli.flags import bare_message, spec_args_from_flags
    from eaglewire.errors import ConfigError

    path = Path(text)
    if path.is_file():
        try:
            nodes = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"--tree {path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"--tree {path}: invalid UTF-8 at byte {e.start}") from None
        if (
            not isinstance(nodes, list)
            or not nodes
            or not all(isinstance(n, list) and n and all(type(r) is int for r in n) for n in nodes)
        ):
            raise ConfigError(
                f"--tree {path}: expected a non-empty JSON list of rank paths like [[0],[1],[0,0]]"
            )
        return [tuple(n) for n in nodes]
    setting = text.split(",")
    if len(setting) == 3 and all(p.strip().isdigit() for p in setting):
        names = {"num_steps": "NUM_STEPS", "topk": "TOPK", "num_draft_tokens": "NUM_DRAFT_TOKENS"}
        steps, topk, num_draft_tokens = (int(p) for p in setting)
        try:
            spec = spec_args_from_flags(steps, topk, num_draft_tokens, names=names)
        except ConfigError as e:
            raise ConfigError(f"--tree {text}: {bare_message(e)}", fix=e.fix) from None
        if spec.is_chain:
            raise ConfigError(f"--tree {text}: topk=1 is a chain", fix="predict chains with --num-steps")
        return spec
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(
            f"--tree: expected NUM_STEPS,TOPK,NUM_DRAFT_TOKENS like 8,8,128, TOPKxDEPTH like 2x3 or a JSON file, "
            f"got {text!r}"
        )
    topk, depth = int(parts[0]), int(parts[1])
    if topk < 1 or depth < 1:
        raise ConfigError(f"--tree {text}: expected TOPK >= 1 and DEPTH >= 1 in TOPKxDEPTH")
    if depth > MAX_EVAL_STEPS:
        raise ConfigError(
            f"--tree {text}: DEPTH {depth} is over {MAX_EVAL_STEPS} (the deepest eval predicts)"
        )
    if topk**depth > 1_000_000:
        raise ConfigError(f"--tree {text}: a full tree of {topk}^{depth} leaves is too large to replay")
    return [p for d in range(1, depth + 1) for p in product(range(topk), repeat=d)]


def check_eval_flags(
    *, num_steps: int, depth: int, batch_size: int, max_length: int, max_records: int, horizon: int,
    target_dtype: str | None,
) -> None:  # fmt: skip
    """Every numeric flag of `eval`, named as typed, before any work. `depth`: the --tree's depth (0: none)."""
    from eaglewire.cli.flags import at_least, in_range, one_of
    from eaglewire.errors import ConfigError

    in_range(
        "--num-steps", num_steps, 1, MAX_EVAL_STEPS,
        meaning=f"draft steps evaluated; past {MAX_EVAL_STEPS} no chain keeps a measurable acceptance",
    )  # fmt: skip
    if depth > MAX_EVAL_STEPS:
        raise ConfigError(
            f"--tree: depth {depth} is over {MAX_EVAL_STEPS}, the deepest eval predicts",
            fix=f"use a --tree of depth <= {MAX_EVAL_STEPS}",
        )
    at_least("--batch-size", batch_size, 1, "rows per forward")
    steps = max(num_steps, depth)
    if max_length < steps + 2:
        raise ConfigError(
            f"--max-length: expected >= {steps + 2} tokens per row ({steps} steps evaluated + 2: step s at "
            f"position t predicts token t+2+s), got {max_length}",
            fix=f"pass --max-length {max(steps + 2, 2048)}, or evaluate fewer steps (--num-steps)",
        )
    at_least("--max-records", max_records, 0, "0 = all records")
    at_least("--horizon", horizon, 0, "tokens of each response; 0 = whole responses")
    one_of("--target-dtype", target_dtype, TARGET_DTYPES)


def eval_command(
    draft: Path = typer.Option(
        ..., "--draft", help="draft directory (e.g. RUN/draft from `eaglewire train`)"
    ),
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    data: Path = typer.Option(..., "--data", help="held-out tokenized dataset or shard directory"),
    num_steps: int = typer.Option(5, "--num-steps", help="chain length k (= draft steps evaluated)"),
    tree: str = typer.Option(None, "--tree", help=TREE_HELP),
    max_records: int = typer.Option(0, "--max-records", help="0 = all records"),
    batch_size: int = typer.Option(4, "--batch-size"),
    max_length: int = typer.Option(2048, "--max-length"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    target_dtype: str = typer.Option(None, "--target-dtype"),
    horizon: int = typer.Option(
        0,
        "--horizon",
        help="predict tau over the first N tokens of each response, as a decoder with max_new_tokens=N "
        "(0 = whole responses)",
    ),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Per-step accuracy (unconditional and given all earlier steps right) and predicted tau."""
    from eaglewire.engine.spec_args import SpecArgs  # pure: no torch

    shape = _parse_tree(tree) if tree else None
    setting = shape if isinstance(shape, SpecArgs) else None
    nodes = shape if isinstance(shape, list) and shape else None
    depth = setting.num_steps if setting is not None else max((len(n) for n in nodes or []), default=0)
    check_eval_flags(
        num_steps=num_steps, depth=depth, batch_size=batch_size, max_length=max_length,
        max_records=max_records, horizon=horizon, target_dtype=target_dtype,
    )  # fmt: skip
    dev = resolve_device(device)
    from eaglewire.predict.evaluation import (
        run_eval,  # here, after the flags are checked: torch loads only now
    )

    loaded = None
    if setting is not None:  # its answers are decoded over the full target: loaded once, for both
        import torch

        from eaglewire.target.loading import load_target
        from eaglewire.train.run import default_target_dtype

        loaded = load_target(
            target, dtype=target_dtype or default_target_dtype(torch.device(dev)), device=dev
        )
    result = run_eval(
        draft_dir=draft,
        target=target,
        data_dir=data,
        num_steps=max(num_steps, depth),
        batch_size=batch_size,
        max_length=max_length,
        max_records=max_records,
        device=dev,
        target_dtype=target_dtype,
        loaded=loaded,
    )
    if horizon:
        result = replace(result, horizon=horizon)
    summary = result.summary()
    report = {
        "horizon": horizon or None,
        **summary,
        "num_steps": num_steps,
        "tau_pred_chain": {k: result.tau_chain(k) for k in range(1, num_steps + 1)},
        **_vocab_report(result, num_steps),
        **_tree_report(result, setting, nodes, loaded, draft, data, max_records),
    }
    if json_out:
        print_json(report)
        return
    rows = [
        [s + 1, f"{a:.4f}", f"{c:.4f}", n, f"{result.tau_chain(s + 1):.3f}" if s < num_steps else "-"]
        for s, (a, c, n) in enumerate(
            zip(summary["acc"], summary["cond_acc"], summary["valid_rows"], strict=True)
        )
    ]
    bound = report["tau_pred_chain_full_vocab"]
    print_table(
        f"{draft} on {data}: {summary['records']} records, {summary['tokens']} tokens, "
        f"{summary['oov_masked']} target tokens outside the draft vocab",
        ["draft token", "acc", "cond acc", "positions", "tau_pred (chain of this length)"],
        rows,
        caption=None
        if bound is None
        else f"with every label outside the draft vocab drafted right, the chain of {num_steps} would predict "
        f"{bound:.3f} (+{bound - result.tau_chain(num_steps):.3f}): the most a larger --draft-vocab-size can add",
    )
    by_turn = result.replay_chain_by_turn(num_steps) if result.has_positions else {}
    if len(by_turn) > 1:  # multi-turn records: a benchmark prompt's answer is a first answer
        print_table(
            f"tau_pred of the chain of {num_steps} by answer",
            ["answer", "tau_pred", "rounds"],
            [[t, f"{r.tau:.3f}", r.rounds] for t, r in by_turn.items()],
        )
    if report["tau_pred_tree"] is not None:
        skipped = report.get("tree_answers_skipped")
        row = [
            report["tree_nodes"],
            depth,
            f"{report['tau_pred_tree']:.3f}",
            report["tree_prediction_method"],
        ]
        print_table("tree", ["nodes", "depth", "tau_pred", "method"], [row],
                    caption=f"answers skipped: {skipped}" if skipped else None)  # fmt: skip


def _vocab_report(result: EvalResult, num_steps: int) -> dict[str, Any]:
    """The labels outside the draft vocabulary per step, and the chain's tau_pred were they drafted right."""
    if not result.has_positions or num_steps < 1:
        return {"out_of_vocab_share": None, "tau_pred_chain_full_vocab": None}
    return {"out_of_vocab_share": result.out_of_vocab_share(),
            "tau_pred_chain_full_vocab": result.without_vocab_misses().tau_chain(num_steps)}  # fmt: skip


def _tree_report(
    result: EvalResult, setting: SpecArgs | None, nodes: list[tuple[int, ...]] | None,
    loaded: LoadedTarget | None, draft: Path, data: Path, max_records: int,
) -> dict[str, Any]:  # fmt: skip
    """The tree's predicted tau and how it was predicted: an engine setting's dynamic tree decoded over
    the held-out answers (`predict.heldout_trees`), or a static tree replayed by the evaluation."""
    from eaglewire.predict.predictor import DYNAMIC_TREE_METHOD, static_tree_method

    if setting is not None:
        from eaglewire.predict.heldout_trees import heldout_tree_predictor

        assert loaded is not None  # eval_command loads the target for a setting
        predictor = heldout_tree_predictor(result, loaded, draft, data, max_records=max_records)
        tau = predictor.tau_dynamic_tree(setting)
        held = predictor.texts()
        return {"tau_pred_tree": tau, "tree_prediction_method": DYNAMIC_TREE_METHOD,
                "tree_setting": {"num_steps": setting.num_steps, "topk": setting.topk,
                                 "num_draft_tokens": setting.num_draft_tokens},
                "tree_nodes": setting.num_draft_tokens - 1,
                "tree_answers_replayed": len(held.texts), "tree_answers_skipped": held.skipped}  # fmt: skip
    if nodes:
        return {"tau_pred_tree": result.tau_tree(nodes), "tree_prediction_method": static_tree_method(result),
                "tree_nodes": len(nodes)}  # fmt: skip
    return {"tau_pred_tree": None, "tree_nodes": None}


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
