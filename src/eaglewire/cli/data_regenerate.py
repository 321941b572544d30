"""`eaglewire data regenerate`: the target answers every user turn, locally or through a server; and the
input flags and tokenizer loading the other `data` commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from eaglewire.cli.common import DEVICE_HELP, print_table, resolve_device
from eaglewire.cli.flags import at_least, in_range
from eaglewire.outputs import check_output_file

INPUT_HELP = "JSONL file (OpenAI messages / ShareGPT conversations / prompt rows) or builtin:chitchat|humaneval|magpie|long-chat|long-docs"
SPLIT_HELP = "split of a built-in set: train (default) or eval (the fixed held-out split; never train on it)"


def tokenizer_for(target: str) -> Any:
    """A tokenizer from a model directory or 'smollm2', without loading weights when possible."""
    from eaglewire.errors import TargetFilesError
    from eaglewire.target.loading import load_target, load_tokenizer, resolve_target_path

    path = resolve_target_path(target)
    if path.is_dir():
        tok = load_tokenizer(path)
    else:
        tok = load_target(target, dtype="float32").tokenizer
    if tok is None:
        raise TargetFilesError(
            f"{target}: no tokenizer files", fix="point --target at a directory with tokenizer.json"
        )
    return tok


def _check_regenerate_out(out: Path, input: str) -> None:
    """`data regenerate --out` appends to its own earlier output (resume) and writes nothing else:
    not the input, not a file it did not write (its `.regen.json` settings sit beside its own)."""
    from eaglewire.errors import ConfigError

    if Path(input).exists() and Path(input).resolve() == out.resolve():
        raise ConfigError(
            f"--out {out}: is the --input file; regeneration appends to --out",
            fix="choose another --out (a new file)",
        )
    # eaglewire.data.regenerate.sidecar_path (not imported here: it pulls in torch)
    check_output_file(out, own=out.with_name(out.name + ".regen.json"), command="eaglewire data regenerate")


def _check_regenerate_flags(
    *, limit: int | None, max_new_tokens: int, batch_size: int, temperature: float, top_p: float,
    max_prompt_tokens: int | None, magpie_prompts: int, magpie_opened_fraction: float, max_seconds: float,
) -> None:  # fmt: skip
    """`data regenerate`'s numeric flags, named as typed, before any work."""
    at_least("--limit", limit, 1, "use the first N conversations; omit it for all")
    at_least("--max-new-tokens", max_new_tokens, 1, "tokens per answer at most")
    at_least("--batch-size", batch_size, 1, "conversations generated together")
    at_least("--temperature", temperature, 0.0, "0 = greedy")
    in_range("--top-p", top_p, 0.0, 1.0, low_open=True, meaning="nucleus mass; 1 = no cut")
    at_least("--max-prompt-tokens", max_prompt_tokens, 1)
    at_least("--magpie-prompts", magpie_prompts, 1)
    in_range("--magpie-opened-fraction", magpie_opened_fraction, 0.0, 1.0)
    at_least("--max-seconds", max_seconds, 0.0, "0 = no budget")


def _check_server_flags(
    *, server: str | None, input: str, model: str | None, concurrency: int | None, max_retries: int | None,
    request_timeout: float | None,
) -> None:  # fmt: skip
    """`data regenerate --server`'s flags, before any work: the others only mean something with it."""
    from eaglewire.errors import ConfigError

    if server is None:
        # (--api-key may come from its environment variable: harmless without --server)
        given = [f for f, v in (("--model", model), ("--concurrency", concurrency), ("--max-retries", max_retries),
                                ("--request-timeout", request_timeout)) if v is not None]  # fmt: skip
        if given:
            raise ConfigError(
                f"{', '.join(given)}: only mean something with --server (regeneration through a server)",
                fix="add --server http://HOST:PORT, or drop those flags to regenerate with the local target",
            )
        return
    at_least("--concurrency", concurrency, 1, "requests in flight at most")
    at_least("--max-retries", max_retries, 0, "retries per request after the first attempt")
    at_least("--request-timeout", request_timeout, 0.001, "seconds per request")
    from eaglewire.data.builtin import builtin_name

    if builtin_name(input) == "magpie":
        raise ConfigError(
            f"--input {input} with --server: Magpie prompts are the target's own raw completions of a bare "
            "user-turn prefix, which a chat server cannot be asked for",
            fix="regenerate builtin:magpie without --server, or pass a prompt file to --input",
        )


def _require_conversations(input: str, count: int, stats: Any, *, allow_empty: bool) -> None:
    """An input that yields no conversation is refused (it would write an empty output), unless --allow-empty."""
    from eaglewire.errors import DataFormatError

    if count or allow_empty:
        return
    raise DataFormatError(
        f"--input {input}: no conversation to regenerate ({stats.lines} lines: {stats.blank_lines} blank, "
        f"{stats.skipped_malformed} malformed, {stats.skipped_empty} empty)",
        fix="check --input (and --limit / --split); pass --allow-empty to write an empty output anyway",
    )


def regenerate_cmd(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    input: str = typer.Option(..., "--input", help=INPUT_HELP),
    out: Path = typer.Option(..., "--out", help="output JSONL (appended; rerun to resume)"),
    split: str = typer.Option("train", "--split", help=SPLIT_HELP),
    temperature: float = typer.Option(
        None, "--temperature", help="0 = greedy [default: 0.7; with --server 0, greedy]"
    ),
    top_p: float = typer.Option(0.95, "--top-p"),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens"),
    batch_size: int = typer.Option(16, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    limit: int = typer.Option(None, "--limit", help="use only the first N conversations"),
    max_prompt_tokens: int = typer.Option(
        None, "--max-prompt-tokens", help="stop a conversation when its prompt is longer"
    ),
    magpie_prompts: int = typer.Option(1000, "--magpie-prompts", help="prompts to sample for builtin:magpie"),
    magpie_opened_fraction: float = typer.Option(
        0.0,
        "--magpie-opened-fraction",
        help="share of builtin:magpie prompts started with an instruction opening ('Write', 'Solve', "
        "'Act as', ...; eaglewire.data.magpie.MAGPIE_OPENINGS): more kinds of request than the target asks alone",
    ),
    chat_template: str = typer.Option(
        None, "--chat-template", help="Jinja file (or text) replacing the tokenizer's"
    ),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="skip (and count) malformed lines instead of failing"
    ),
    dtype: str = typer.Option("bfloat16", "--dtype"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    max_seconds: float = typer.Option(
        0.0, "--max-seconds", help="start no new batch after this long (0 = no budget); rerun to resume"
    ),
    continuous: bool = typer.Option(
        False,
        "--continuous/--batched",
        help="refill generation rows as answers finish (continuous batching) instead of running each batch "
        "to its longest answer",
    ),
    allow_empty: bool = typer.Option(
        False,
        "--allow-empty",
        help="an input with no conversation (empty, or every row skipped) writes an empty output "
        "instead of failing",
    ),
    server: str = typer.Option(
        None,
        "--server",
        help="regenerate through an OpenAI-compatible server (vLLM, SGLang, eaglewire serve) at this URL "
        "(http://HOST:PORT or its /v1 base): each user turn goes to /v1/chat/completions; --target then lends "
        "only its tokenizer and chat template (to count prompts), and --dtype, --device, --batch-size and "
        "--continuous are not used",
    ),
    model: str = typer.Option(
        None, "--model", help="with --server: the served model's name [default: the one the server lists]"
    ),
    concurrency: int = typer.Option(
        None, "--concurrency", help="with --server: requests in flight at most [default: 8]"
    ),
    max_retries: int = typer.Option(
        None,
        "--max-retries",
        help="with --server: retries of a request on HTTP 429/502/503/504, a dropped connection or a timeout "
        "(exponential backoff with jitter; Retry-After honoured) before the run stops [default: 8]",
    ),
    request_timeout: float = typer.Option(
        None, "--request-timeout", help="with --server: seconds one request may take [default: 600]"
    ),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="EAGLEWIRE_SERVER_API_KEY",
        help="with --server: sent as 'Authorization: Bearer KEY'",
    ),
) -> None:
    """The target answers every user turn (EAGLE-3's self-distillation); output is JSONL again.

    With --server the target answers through an OpenAI-compatible server instead (the path for targets
    that need tensor parallelism or a cluster): the same prompts, output rows, order and resume rules.
    """
    _check_regenerate_out(out, input)
    if temperature is None:
        temperature = 0.0 if server is not None else 0.7
    _check_regenerate_flags(
        limit=limit, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature,
        top_p=top_p, max_prompt_tokens=max_prompt_tokens, magpie_prompts=magpie_prompts,
        magpie_opened_fraction=magpie_opened_fraction, max_seconds=max_seconds,
    )  # fmt: skip
    _check_server_flags(
        server=server, input=input, model=model, concurrency=concurrency, max_retries=max_retries,
        request_timeout=request_timeout,
    )  # fmt: skip
    if server is not None:
        from eaglewire.data.regenerate_client import server_base_url

        server_base_url(server)  # a malformed URL is refused before any work
    from dataclasses import replace

    from eaglewire.data.build import load_source
    from eaglewire.data.builtin import builtin_name, parse_split, select_split
    from eaglewire.data.formats import ReadStats
    from eaglewire.data.generation import SamplingConfig, pick_generate_fn
    from eaglewire.data.magpie import DEFAULT_MAGPIE_SAMPLING, cached_magpie_prompts
    from eaglewire.data.regenerate import regenerate
    from eaglewire.target.loading import load_target

    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size
    )
    if builtin_name(input) != "magpie":  # the input is read (an empty one refused) before the target loads
        convs, read_stats = load_source(
            input, split=parse_split(split), require_assistant=False, skip_bad=skip_bad, limit=limit
        )
        _require_conversations(input, len(convs), read_stats, allow_empty=allow_empty)
    if server is not None:
        from eaglewire.data.regenerate_client import RetryPolicy, ServerSettings
        from eaglewire.data.regenerate_http import regenerate_via_server

        settings = ServerSettings(
            url=server,
            model=model,
            concurrency=8 if concurrency is None else concurrency,
            api_key=api_key,
            request_timeout_s=600.0 if request_timeout is None else request_timeout,
            retry=RetryPolicy() if max_retries is None else RetryPolicy(max_retries=max_retries),
        )
        stats = regenerate_via_server(
            tokenizer_for(target),
            convs,
            out,
            sampling,
            settings,
            chat_template=chat_template,
            max_prompt_tokens=max_prompt_tokens,
            show_progress=progress,
            max_seconds=max_seconds,
            allow_empty=allow_empty,
        )
        _print_regenerated(out, stats, read_stats)
        return
    loaded = load_target(target, dtype=dtype, device=resolve_device(device))
    if builtin_name(input) == "magpie":
        magpie_sampling = replace(DEFAULT_MAGPIE_SAMPLING, seed=seed, batch_size=batch_size)
        prompts = cached_magpie_prompts(
            loaded,
            out.with_name(out.name + ".prompts.jsonl"),
            magpie_prompts,
            sampling=magpie_sampling,
            chat_template=chat_template,
            show_progress=progress,
            opened_fraction=magpie_opened_fraction,
        )
        convs, read_stats = select_split(prompts, parse_split(split))[:limit], ReadStats(records=len(prompts))
    stats = regenerate(
        loaded,
        convs,
        out,
        sampling,
        chat_template=chat_template,
        max_prompt_tokens=max_prompt_tokens,
        show_progress=progress,
        max_seconds=max_seconds,
        generate_fn=pick_generate_fn(continuous=continuous),
        allow_empty=allow_empty,
    )
    _print_regenerated(out, stats, read_stats)


def _print_regenerated(out: Path, stats: Any, read_stats: Any) -> None:
    print_table(
        f"regenerated into {out}",
        ["field", "value"],
        [
            ["conversations", stats.conversations],
            ["already done (resumed)", stats.already_done],
            ["written now", stats.written],
            ["answers / cut at max tokens", f"{stats.answers} / {stats.answers_cut_at_max_tokens}"],
            ["generated tokens", stats.generated_tokens],
            ["tokens/s", f"{stats.tokens_per_second:.1f}"],
            ["stopped at --max-seconds (rerun resumes)", stats.stopped_at_time_budget],
            ["skipped input (malformed/empty)", f"{read_stats.skipped_malformed}/{read_stats.skipped_empty}"],
            ["backend", stats.backend],
            *[["note", note] for note in stats.notes],
        ],
    )
