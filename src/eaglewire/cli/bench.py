"""`eaglewire bench`: our plain decode, EAGLE-3 chain and tree, and transformers baselines on the same
prompts and device; or, with --sweep, every valid speculative setting and the fastest one."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from eaglewire.bench.sweep_grid import DEFAULT_NUM_DRAFT_TOKENS, DEFAULT_NUM_STEPS, DEFAULT_TOPK
from eaglewire.cli.common import DEVICE_HELP, EXIT_FINDING, parse_int_list, print_json, resolve_device
from eaglewire.cli.flags import at_least, one_of, spec_args_from_flags
from eaglewire.errors import ConfigError

if TYPE_CHECKING:
    from eaglewire.bench.prompts import PromptSet
    from eaglewire.bench.sweep import SweepConfig
    from eaglewire.predict.predictor import TauPredictor
    from eaglewire.target.loading import LoadedTarget


DEFAULT_METHODS = "plain,eagle-chain,eagle-tree,hf-generate,hf-prompt-lookup,hf-static-compiled"


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _ints(text: str, what: str) -> tuple[int, ...]:
    values = parse_int_list(text, what=what)
    if not values:
        raise ConfigError(f"{what}: expected at least one integer, got {text!r}")
    return tuple(values)


def command_line(ctx: typer.Context) -> str:
    """The command as typed, rebuilt from the parsed options that differ from their defaults."""
    # `python -m eaglewire` names the root "python -m eaglewire": record the console script instead
    parts = ["eaglewire", ctx.info_name or "bench"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or value == param.default or not param.opts:
            continue
        if isinstance(value, bool):
            secondary = getattr(param, "secondary_opts", None) or []
            flag = param.opts[0] if value else (secondary[0] if secondary else None)
            if flag:
                parts.append(flag)
        else:
            parts += [param.opts[0], str(value)]
    return shlex.join(parts)


def _check_bench_flags(
    *, num_prompts: int, max_new_tokens: int, methods: str, chain_steps: int, num_steps: int, topk: int,
    num_draft_tokens: int, prompt_lookup_num_tokens: int, warmup: int, repeats: int | None, sweep: bool,
    sweep_values: dict[str, str], eval_max_records: int, eval_answer: int, dtype: str,
) -> None:  # fmt: skip
    """`bench`'s numeric flags, named as typed, before any work (no torch imported, nothing loaded)."""
    at_least("--num-prompts", num_prompts, 0, "0 = all prompts")
    at_least("--max-new-tokens", max_new_tokens, 1, "tokens generated per prompt at most")
    at_least("--warmup", warmup, 0, "untimed runs")
    at_least("--repeats", repeats, 1, "timed runs per prompt")
    at_least("--eval-max-records", eval_max_records, 0, "0 = all")
    at_least("--eval-answer", eval_answer, 0, "0 = every answer, N >= 1 = each record's N-th answer")
    one_of("--dtype", dtype, ("auto", "float32", "bfloat16", "float16"))
    if sweep:
        for flag, text in sweep_values.items():
            bad = [v for v in _ints(text, flag) if v < 1]
            if bad:
                raise ConfigError(f"{flag}: expected positive integers, got {text!r}")
        return
    bad_sizes = [v for v in _ints(sweep_values["--batch-sizes"], "--batch-sizes") if v < 1]
    if bad_sizes:
        raise ConfigError(f"--batch-sizes: expected positive integers, got {bad_sizes}")
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    if "eagle-chain" in chosen:
        at_least("--chain-steps", chain_steps, 1, "draft tokens per round")
    if "eagle-tree" in chosen:
        spec_args_from_flags(num_steps, topk, num_draft_tokens)
    if "hf-prompt-lookup" in chosen:
        at_least("--prompt-lookup-num-tokens", prompt_lookup_num_tokens, 1)


def bench(
    ctx: typer.Context,
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    draft: Path = typer.Option(
        None, "--draft", help="draft directory; needed by eagle-chain, eagle-tree and --sweep"
    ),
    prompts: str = typer.Option(
        "mt-bench",
        "--prompts",
        help="mt-bench | user-eval | chitchat-eval | humaneval-eval | long-1k | long-2k | long-4k | long-8k | a JSONL "
        'file ({"prompt"}, messages, MT-bench rows)',
    ),
    num_prompts: int = typer.Option(0, "--num-prompts", help="use the first N prompts (0 = all)"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="tokens generated per prompt at most"),
    methods: str = typer.Option(
        DEFAULT_METHODS,
        "--methods",
        help="comma-separated methods to run, in order",
    ),
    chain_steps: int = typer.Option(5, "--chain-steps", help="eagle-chain: draft tokens per round"),
    num_steps: int = typer.Option(5, "--num-steps", help="eagle-tree: = SGLang --speculative-num-steps"),
    topk: int = typer.Option(4, "--topk", help="eagle-tree: = SGLang --speculative-eagle-topk"),
    num_draft_tokens: int = typer.Option(
        8, "--num-draft-tokens", help="eagle-tree: = SGLang --speculative-num-draft-tokens"
    ),
    prompt_lookup_num_tokens: int = typer.Option(
        10, "--prompt-lookup-num-tokens", help="hf-prompt-lookup setting"
    ),
    warmup: int = typer.Option(1, "--warmup", help="untimed runs of each prompt per method or sweep setting"),
    repeats: int = typer.Option(
        None, "--repeats", help="timed runs per prompt, median reported (default 3; --sweep: 1)"
    ),
    sweep: bool = typer.Option(
        False, "--sweep", help="sweep num_steps x topk x num_draft_tokens instead; write best_setting.json"
    ),
    sweep_num_steps: str = typer.Option(
        _csv(DEFAULT_NUM_STEPS), "--sweep-num-steps", help="--sweep: num_steps values"
    ),
    sweep_topk: str = typer.Option(
        _csv(DEFAULT_TOPK), "--sweep-topk", help="--sweep: topk values (1 = chain)"
    ),
    sweep_num_draft_tokens: str = typer.Option(
        _csv(DEFAULT_NUM_DRAFT_TOKENS), "--sweep-num-draft-tokens", help="--sweep: tree sizes"
    ),
    batch_sizes: str = typer.Option(
        "1",
        "--batch-sizes",
        help="batch sizes (concurrent requests). Without --sweep, more than '1' runs plain, eagle-chain and "
        "eagle-tree at each through the batched engine, predicts the speed-up per size from the round costs "
        "and writes the batch rule serve decodes by (--write-best: also into --draft/batch_rules/); "
        "with --sweep: plain runs at each, speculative settings at batch 1",
    ),
    write_best: bool = typer.Option(
        True, "--write-best/--no-write-best", help="--sweep: write best_setting.json into --draft"
    ),
    sweep_resume: bool = typer.Option(
        True,
        "--sweep-resume/--no-sweep-resume",
        help="--sweep: each finished setting is saved to --out/sweep.partial.json at once; reuse the "
        "settings a cut-short run of the same sweep saved there (--no-sweep-resume: measure them again)",
    ),
    eval_report: Path = typer.Option(
        None,
        "--eval-report",
        help="offline evaluation JSON with cond_acc (default: train_summary.json beside the draft)",
    ),
    eval_data: Path = typer.Option(
        None,
        "--eval-data",
        help="held-out tokenized dataset or shard dir: run the offline evaluation here (predicts chains and trees)",
    ),
    eval_max_records: int = typer.Option(
        200, "--eval-max-records", help="--eval-data: records evaluated (0 = all)"
    ),
    eval_answer: int = typer.Option(
        1,  # eaglewire.predict.evaluation.FIRST_ANSWER (not imported here: it pulls in torch)
        "--eval-answer",
        help="--eval-data: replay only each record's N-th answer (1: first answers, what a prompt set's "
        "prompts get; later answers of multi-turn records draft more easily); 0 = every answer",
    ),
    served_prediction: bool = typer.Option(
        True,
        "--served-prediction/--no-served-prediction",
        help="with --draft: replay each speculative setting offline over the text it served and report that "
        "predicted tau beside the measured one (per setting with --sweep too)",
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="float32 | bfloat16 | auto (bfloat16 on CUDA, float32 on CPU)"
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    raw: bool = typer.Option(False, "--raw", help="do not apply the chat template"),
    out: Path = typer.Option(
        Path("bench-results"), "--out", help="directory for bench.json/.md and PNG plots"
    ),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="write PNG plots (needs matplotlib)"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON report instead of the table"),
) -> None:
    """Benchmark decoding: tokens/s, speedups, tau, per-position acceptance, phase breakdown, greedy check.

    Example: eaglewire bench --target smollm2 --draft runs/draft --prompts mt-bench --out bench-out
    """
    _check_bench_flags(
        num_prompts=num_prompts, max_new_tokens=max_new_tokens, methods=methods, chain_steps=chain_steps,
        num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens, warmup=warmup, repeats=repeats, sweep=sweep,
        sweep_values={"--sweep-num-steps": sweep_num_steps, "--sweep-topk": sweep_topk,
                      "--sweep-num-draft-tokens": sweep_num_draft_tokens, "--batch-sizes": batch_sizes},
        eval_max_records=eval_max_records, eval_answer=eval_answer, dtype=dtype,
    )  # fmt: skip
    from eaglewire.output_marker import OutputKind
    from eaglewire.outputs import check_resumable_dir, claim_output_dir

    # A rerun into its own report directory rewrites the reports (a cut sweep resumes there); anything else: refused
    check_resumable_dir(out, OutputKind.BENCH)
    from eaglewire.bench.by_context import load_prompt_sets

    prompt_sets = load_prompt_sets(prompts, num_prompts or None)  # every set read (and named) first
    sizes = _ints(batch_sizes, "--batch-sizes")
    if len(prompt_sets) > 1 and (sweep or sizes != (1,)):
        raise ConfigError(
            f"--prompts {prompts}: several prompt sets run the method table, one set at a time",
            fix="pass one set to --prompts with --sweep or --batch-sizes",
        )
    if eval_data is not None and draft is None:
        raise ConfigError("--eval-data evaluates a draft", fix="pass --draft DIR")
    from eaglewire.bench.by_context import check_before_loading
    from eaglewire.bench.harness import BenchConfig
    from eaglewire.bench.sweep_grid import sweep_settings
    from eaglewire.predict.heldout_trees import evaluate_predictor
    from eaglewire.predict.predictor import find_summary_predictor, load_summary_predictor
    from eaglewire.target.loading import load_target

    device = resolve_device(device)
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    command = command_line(ctx)
    cfg = BenchConfig(
        max_new_tokens=max_new_tokens,
        methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
        chain_steps=chain_steps,
        tree_num_steps=num_steps,
        tree_topk=topk,
        tree_num_draft_tokens=num_draft_tokens,
        warmup=warmup,
        repeats=3 if repeats is None else repeats,
        chat=not raw,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
        served_prediction=served_prediction,
    ) if not sweep and sizes == (1,) else None  # fmt: skip
    tokenizer = None
    if cfg is not None or sweep:  # (--batch-sizes checks its prompts once its widest setting is chosen)
        if cfg is not None:
            tree_tokens = cfg.max_tree_tokens
        else:
            grid = [_ints(v, f) for v, f in ((sweep_num_steps, "--sweep-num-steps"), (sweep_topk, "--sweep-topk"),
                                             (sweep_num_draft_tokens, "--sweep-num-draft-tokens"))]  # fmt: skip
            tree_tokens = max((s.num_draft_tokens for s in sweep_settings(*grid)[0]), default=0)
        # every prompt of every set against the target's positions, before its weights load
        tokenizer = check_before_loading(
            target, prompt_sets, max_new_tokens=max_new_tokens, tree_tokens=tree_tokens, chat=not raw
        )
    # once: the bench and the held-out prediction
    loaded = load_target(target, dtype=dtype, device=device, tokenizer=tokenizer)
    predictor: TauPredictor | None = None
    if eval_data is not None:
        steps = max(_ints(sweep_num_steps, "--sweep-num-steps")) if sweep else max(chain_steps, num_steps)
        # chains by the evaluation's replay, trees decoded by the engine's drafter over the held-out answers
        predictor = evaluate_predictor(
            draft,
            loaded,
            eval_data,
            num_steps=steps,
            max_records=eval_max_records,
            horizon=max_new_tokens,
            answer=eval_answer or None,
        )
    elif eval_report is not None:
        predictor = load_summary_predictor(eval_report)
    elif draft is not None:
        predictor = find_summary_predictor(draft)

    if sweep:
        from eaglewire.bench.sweep import SweepConfig

        if draft is None:
            raise ConfigError("--sweep needs a draft", fix="pass --draft DIR")
        sweep_cfg = SweepConfig(
            num_steps=_ints(sweep_num_steps, "--sweep-num-steps"),
            topk=_ints(sweep_topk, "--sweep-topk"),
            num_draft_tokens=_ints(sweep_num_draft_tokens, "--sweep-num-draft-tokens"),
            batch_sizes=_ints(batch_sizes, "--batch-sizes"),
            max_new_tokens=max_new_tokens,
            warmup=warmup,
            repeats=1 if repeats is None else repeats,
            chat=not raw,
            served_prediction=served_prediction,
        )
        _sweep(
            loaded, draft, prompt_sets[0], sweep_cfg, predictor, command, out, plots, as_json, write_best, dtype,
            resume=sweep_resume,
        )  # fmt: skip
        return

    if sizes != (1,):
        _batched(
            loaded, draft, prompt_sets[0], sizes, methods, chain_steps, num_steps, topk, num_draft_tokens,
            max_new_tokens, warmup, not raw, command, out, plots, as_json, write_best, dtype,
        )  # fmt: skip
        return

    from eaglewire.bench.by_context import run_by_context
    from eaglewire.bench.harness import run_benchmark

    assert cfg is not None
    meta = {"command": command}
    if len(prompt_sets) > 1:
        by_context = run_by_context(loaded, draft, prompt_sets, cfg, meta=meta, predictor=predictor)
        reports = by_context.sets
        report_out: Any = by_context
    else:
        report_out = run_benchmark(loaded, draft, prompt_sets[0], cfg, meta=meta, predictor=predictor)
        reports = {prompt_sets[0].name: report_out}
    claim_output_dir(out, OutputKind.BENCH)
    paths = report_out.write(out, plots=plots)
    if as_json:
        print_json(report_out.to_json())
    else:
        typer.echo(report_out.markdown())
        typer.echo("wrote " + ", ".join(str(p) for p in paths))
    ours_differ = [
        f"{name}{'' if len(reports) == 1 else f' on {set_name}'}: {len(r.mismatches)} prompt(s)"
        for set_name, report in reports.items()
        for name, r in report.results.items()
        if name.startswith("eagle-") and r.mismatches
    ]
    if ours_differ:
        _greedy_finding(
            "speculative greedy output differs from plain greedy: " + "; ".join(ours_differ), dtype
        )


def _batched(
    loaded: LoadedTarget, draft: Path | None, prompt_set: PromptSet, sizes: tuple[int, ...], methods: str,
    chain_steps: int, num_steps: int, topk: int, num_draft_tokens: int, max_new_tokens: int, warmup: int,
    chat: bool, command: str, out: Path, plots: bool, as_json: bool, write_rule: bool, dtype: str,
) -> None:  # fmt: skip
    """`bench --batch-sizes`: every method at every batch size (`eaglewire.bench.batched`)."""
    from eaglewire.bench.batched import BATCH_METHODS, BatchBenchConfig, run_batch_benchmark
    from eaglewire.engine.spec_args import SpecArgs
    from eaglewire.output_marker import OutputKind
    from eaglewire.outputs import claim_output_dir
    from eaglewire.predict.by_batch import rule_path

    chosen = (
        BATCH_METHODS
        if methods == DEFAULT_METHODS
        else tuple(m.strip() for m in methods.split(",") if m.strip())
    )
    if draft is None and methods == DEFAULT_METHODS:
        chosen = ("plain",)
    bad = [s for s in sizes if s < 1]
    if bad:
        raise ConfigError(f"--batch-sizes: expected positive integers, got {bad}")
    cfg = BatchBenchConfig(
        batch_sizes=tuple(sorted(set(sizes))),
        methods=chosen,
        chain=SpecArgs.chain(chain_steps),
        tree=spec_args_from_flags(num_steps, topk, num_draft_tokens),
        max_new_tokens=max_new_tokens,
        warmup=warmup > 0,
        chat=chat,
    )
    report = run_batch_benchmark(loaded, draft, prompt_set, cfg, command=command)
    claim_output_dir(out, OutputKind.BENCH)
    paths = report.write(out, plots=plots)
    rule = report.rule()
    if rule is not None:
        paths.append(rule.save(out / "batch_rule.json"))
        if write_rule and draft is not None and any(m != "plain" for m in chosen):
            paths.append(rule.save(rule_path(draft, rule.device)))
    if as_json:
        print_json(report.to_json())
    else:
        typer.echo(report.markdown())
        typer.echo("wrote " + ", ".join(str(p) for p in paths))
    differ = report.greedy_differences()
    if differ:
        _greedy_finding(
            "batched speculative greedy output differs from plain greedy at the same batch size: "
            + "; ".join(differ),
            dtype,
        )


def _greedy_finding(what: str, dtype: str) -> None:
    """float32: a speculative/plain difference is a bug (exit 1). Lower precision: verifying N tokens in
    one forward rounds differently from decoding one, so a near-tie argmax may flip; warn only."""
    if dtype == "float32":
        typer.echo(f"NOT LOSSLESS: {what}", err=True)
        raise typer.Exit(EXIT_FINDING)
    typer.echo(
        f"warning: {what} (in {dtype}, batched verification rounds differently from one-token decoding; "
        "rerun with --dtype float32 to tell a bug from rounding)",
        err=True,
    )


def _sweep(
    loaded: LoadedTarget,
    draft: Path,
    prompt_set: PromptSet,
    cfg: SweepConfig,
    predictor: TauPredictor | None,
    command: str,
    out: Path,
    plots: bool,
    as_json: bool,
    write_best: bool,
    dtype: str,
    *,
    resume: bool,
) -> None:
    from eaglewire.bench.report import describe_device, now_iso
    from eaglewire.bench.sweep import run_sweep, sweep_markdown, write_best_setting, write_sweep
    from eaglewire.output_marker import OutputKind
    from eaglewire.outputs import claim_output_dir

    source = f"{command} | {now_iso()} | {describe_device(loaded.device)}"
    claim_output_dir(out, OutputKind.BENCH)  # before the sweep: it saves each finished setting there
    result = run_sweep(
        loaded, draft, prompt_set, cfg, predictor=predictor, source=source, progress_dir=out, resume=resume
    )
    paths = write_sweep(result, out, plots=plots)
    if write_best:
        best = write_best_setting(result, draft)
        if best is not None:
            paths.append(best)
    if as_json:
        print_json(result.to_json())
    else:
        typer.echo(sweep_markdown(result))
        typer.echo("wrote " + ", ".join(str(p) for p in paths))
    differ = [r.setting for r in result.rows if r.greedy_matches_plain is False]
    if differ:
        _greedy_finding(
            f"greedy output differs from plain greedy at {len(differ)} setting(s), e.g. {differ[0]}", dtype
        )


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
