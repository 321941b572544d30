"""`eaglewire doctor`: will the draft see, when served, the hidden states it was trained on?

Exit 0 when everything matches, 1 when there is a finding (each printed with its fix), 2 when
the input itself is invalid.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from eaglewire.cli.common import console, print_json, print_table

STATUS_STYLE = {"ok": "[green]ok[/green]", "finding": "[red]FINDING[/red]", "skipped": "[dim]skipped[/dim]"}


def doctor(
    draft: Path = typer.Option(
        None, "--draft", help="draft directory: eaglewire, SGLang export or vLLM/speculators export"
    ),
    target: str = typer.Option(None, "--target", help="target model directory, .gguf file, or 'smollm2'"),
    data: Path = typer.Option(None, "--data", help="hidden-state shard directory (eaglewire data capture)"),
    sglang_args: str = typer.Option(
        None, "--sglang-args", help='SGLang server arguments, e.g. "--speculative-algorithm EAGLE3 ..."'
    ),
    sglang_version: str = typer.Option(
        None,
        "--sglang-version",
        help="the SGLang release you serve with, e.g. 0.5.23: its id rule depends on the release and the target "
        "architecture (default: every release eaglewire has read; releases that read the ids apart are a finding)",
    ),
    vllm_version: str = typer.Option(
        None, "--vllm-version", help="the vLLM release you serve with, e.g. 0.33.0 (default: every one read)"
    ),
    vllm_config: Path = typer.Option(
        None, "--vllm-config", help='JSON: {"speculative_config": {...}, "temperature": T}'
    ),
    trace: bool = typer.Option(
        False, "--trace", help="run one prompt and print every tensor crossing target -> draft"
    ),
    prompt: str = typer.Option(None, "--prompt", help="the prompt for --trace"),
    target_dtype: str = typer.Option(
        None, "--target-dtype", help="dtype to run the target in (default: the contract's)"
    ),
    max_records: int = typer.Option(4, "--max-records", help="records sampled from --data"),
    max_tokens: int = typer.Option(
        128, "--max-tokens", help="tokens per record compared; with --served, max_tokens per prompt sent"
    ),
    accuracy_labels: str = typer.Option(
        None,
        "--accuracy-labels",
        help="standalone accuracy against 'target' argmax (training's metric; default with --target) or data 'tokens'",
    ),
    served: str = typer.Option(
        None,
        "--served",
        help="URL of a live server (e.g. http://127.0.0.1:30000): compare its acceptance with the draft's "
        "replay of the served text, and name the miswiring when it falls short (needs --engine, --draft, --target)",
    ),
    engine: str = typer.Option(
        None,
        "--engine",
        help="with --served: sglang | vllm | eaglewire (eaglewire serve): how it reports acceptance",
    ),
    prompts: str = typer.Option(
        None,
        "--prompts",
        help="with --served: a JSONL prompt file or a built-in set (mt-bench, user-eval, humaneval-eval, chitchat-eval, "
        "long-1k, long-2k, long-4k, long-8k); "
        "default: 6 MT-bench first turns and 4 held-out HumanEval prompts",
    ),
    num_prompts: int = typer.Option(
        None, "--num-prompts", help="with --served: send only the first N prompts"
    ),
    concurrency: int = typer.Option(
        1,
        "--concurrency",
        help="with --served: clients sending the prompts at once (a batching server's load, e.g. eaglewire serve "
        "--max-batch 8); 1: one at a time. Not with --engine vllm (its counts are per request only one at a time)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable report"),
) -> None:
    """Check data vs target, draft vs target, draft vs data and serving settings; print a verdict.

    An SGLang or vLLM export given as --draft is read the way its engine reads it (layer ids,
    sizes, norm flags; by values with --target): no serving arguments are needed to check it.

    With --served URL it also asks a live server (SGLang, vLLM or eaglewire serve) for greedy answers, replays
    them with the draft under its wiring and compares the acceptance: exit 0 when they match, 1 naming the
    miswiring (aux states shifted, reordered, the embedding, post-norm, the vocab map, a rewritten draft length)
    and its fix.

    Example: eaglewire doctor --draft out/draft --target smollm2 --data out/shards
    --sglang-args "--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-num-draft-tokens 16"

    Example: eaglewire doctor --served http://127.0.0.1:30000 --engine sglang --draft out/draft --target smollm2
    """
    # here, not at import: torch loads only when a command needs it
    from eaglewire.doctor.run import DoctorOptions, run_doctor
    from eaglewire.doctor.trace import trace_text

    opts = DoctorOptions(
        draft=draft,
        target=target,
        data=data,
        sglang_args=sglang_args,
        sglang_version=sglang_version,
        vllm_version=vllm_version,
        vllm_config=vllm_config,
        trace=trace,
        prompt=prompt,
        target_dtype=target_dtype,
        max_records=max_records,
        max_tokens=max_tokens,
        accuracy_labels=accuracy_labels,
        served=served,
        engine=engine,
        prompts=prompts,
        num_prompts=num_prompts,
        concurrency=concurrency,
    )
    report = run_doctor(opts)
    if as_json:
        print_json(report.to_json())
        raise typer.Exit(report.exit_code)
    if report.trace:
        typer.echo("trace (target -> draft):")
        for line in trace_text(report.trace):
            typer.echo("  " + line)
        typer.echo("trace as JSON lines:")
        for stage in report.trace:
            typer.echo(json.dumps(stage))
    for line in report.detail_lines():
        typer.echo(line)
    print_table(
        "doctor verdict",
        ["check", "status", "summary"],
        [(c, STATUS_STYLE[s], m) for c, s, m in report.verdict_rows()],
    )
    n = len(report.findings)
    console.print(
        "[green]everything matches[/green]"
        if n == 0
        else f"[red]{n} finding(s)[/red]: each one's fix is above"
    )
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
