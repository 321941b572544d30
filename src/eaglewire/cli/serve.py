"""`eaglewire serve`: an OpenAI-compatible HTTP server on the speculative decoder (`eaglewire.serve`)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import typer

from eaglewire.cli.common import DEVICE_HELP, resolve_device
from eaglewire.cli.flags import SPEC_OPTIONS, at_least, in_range, one_of, spec_args_from_options
from eaglewire.contract.numbering import parse_version
from eaglewire.errors import ConfigError

DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 32
ENGINES = ("auto", "eaglewire", "sglang", "vllm")  # eaglewire.serve.loading.ENGINES (not imported: aiohttp)


@SPEC_OPTIONS.add_to(before="dtype")
def serve(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    draft: Path = typer.Option(
        None,
        "--draft",
        help="an eaglewire draft directory, or an SGLang / vLLM export (read as that engine reads it); "
        "omit for plain decoding",
    ),
    engine: str = typer.Option(
        "auto",
        "--engine",
        help="auto | eaglewire | sglang | vllm: which program's reading of --draft to serve (auto: the "
        "directory's own format). An export's layer ids are read as that engine reads them, never corrected",
    ),
    sglang_version: str = typer.Option(
        None,
        "--sglang-version",
        help="with an SGLang export: the SGLang release to serve it as (e.g. 0.5.23), whose id rule for this "
        "target's architecture reads the ids; needed only when the releases eaglewire has read disagree",
    ),
    vllm_version: str = typer.Option(
        None,
        "--vllm-version",
        help="with a vLLM export: the vLLM release to serve it as (e.g. 0.33.0); needed only when releases disagree",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", help="port to listen on (0: any free port; the URL is printed)"
    ),
    served_model_name: str = typer.Option(
        None, "--served-model-name", help="the model id clients see (default: --target as given)"
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 (target and draft)"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    runner: str = typer.Option("auto", "--runner", help="target runtime: auto | fast | hf (full recompute)"),
    context_length: int = typer.Option(
        None,
        "--context-length",
        help="tokens a request may span: prompt + completion + one draft tree (default: the target's "
        "max_position_embeddings, at most 4096)",
    ),
    max_queue: int = typer.Option(
        DEFAULT_MAX_QUEUE,
        "--max-queue",
        help="requests that may wait while --max-batch decode; one more is answered 503 with Retry-After",
    ),
    max_batch: int = typer.Option(
        1,
        "--max-batch",
        help="requests decoded together (continuous batching, each its own acceptance; 1: one at a time). "
        "Above 1 the draft directory's batch rule for this device, when measured, picks where to decode plainly",
    ),
    **spec_options: int,
) -> None:
    """Serve the target with the EAGLE-3 draft over an OpenAI-compatible HTTP API.

    POST /v1/chat/completions and /v1/completions (stream true or false; max_tokens, temperature, top_p,
    stop, seed), GET /v1/models, /health and /metrics (Prometheus text with vLLM's spec-decode
    counters). Each response carries SGLang's per-request speculative fields in sglext.spec_tokens_details.

    Requests queue behind one speculative decoder: up to --max-batch decode together (default 1), at most
    --max-queue wait, and one more gets HTTP 503 with a Retry-After header. A client that disconnects cancels its request. A bad
    request gets HTTP 400 with an OpenAI-style error body naming the field. Nothing is written to disk.

    Stops on Ctrl-C (exit 130, the CLI's "interrupted") or SIGTERM (exit 0), cancelling what is in flight.

    Example: eaglewire serve --target smollm2 --draft runs/draft --port 8000
    """
    # Every flag is checked before any work (no torch imported, no model loaded).
    one_of("--engine", engine, ENGINES)
    one_of("--dtype", dtype, ("float32", "bfloat16"))
    one_of("--runner", runner, ("auto", "fast", "hf"))
    in_range("--port", port, 0, 65535, meaning="0 = any free port")
    at_least("--max-queue", max_queue, 0, "requests waiting behind the one decoding")
    at_least("--max-batch", max_batch, 1, "requests decoded together")
    if max_batch > 1 and runner == "hf":
        raise ConfigError(
            f"--max-batch {max_batch} with --runner hf: batched decoding runs on the fast runtime only",
            fix="use --runner auto or fast (a Llama-family target), or --max-batch 1",
        )
    at_least("--context-length", context_length, 2, "tokens a request may span")
    if not host:
        raise ConfigError("--host: empty", fix="use --host 127.0.0.1 (or 0.0.0.0 for every interface)")
    if served_model_name is not None and not served_model_name.strip():
        raise ConfigError("--served-model-name: empty", fix="drop --served-model-name, or give a name")
    for flag, value, wanted in (
        ("--sglang-version", sglang_version, "sglang"),
        ("--vllm-version", vllm_version, "vllm"),
    ):
        if value is not None and engine not in ("auto", wanted):
            raise ConfigError(
                f"{flag} {value} with --engine {engine}", fix=f"drop {flag}, or use --engine {wanted}"
            )
    for flag, value in (("--sglang-version", sglang_version), ("--vllm-version", vllm_version)):
        if value is not None:
            parse_version(value, flag=flag)  # a release number: refused here, before any work
    spec = spec_args_from_options(spec_options)
    if draft is not None and not draft.is_dir():
        raise ConfigError(
            f"--draft {draft}: not a directory", fix="point --draft at a draft or export directory"
        )
    if importlib.util.find_spec("aiohttp") is None:
        raise ConfigError(
            "eaglewire serve needs aiohttp, which is not installed", fix="pip install 'eaglewire[serve]'"
        )
    device = resolve_device(device)

    from eaglewire.serve.loading import LoadOptions, load_served_model  # here: torch and aiohttp load now
    from eaglewire.serve.server import serve as run_server

    options = LoadOptions(
        target=target,
        draft=draft,
        engine=engine,  # type: ignore[arg-type]  # checked above
        sglang_version=sglang_version,
        vllm_version=vllm_version,
        spec=spec,
        dtype=dtype,
        device=device,
        runner=runner,  # type: ignore[arg-type]  # checked above
        context_length=context_length,
        max_batch=max_batch,
    )
    served = load_served_model(options, served_model_name or target)
    status = run_server(
        served,
        host=host,
        port=port,
        max_queue=max_queue,
        on_listening=_announce,
    )
    if status:
        raise typer.Exit(status)


def _announce(url: str) -> None:
    """One line on stdout once the socket listens (flushed: a script waiting for it reads a pipe)."""
    sys.stdout.write(f"eaglewire serve: listening on {url}\n")
    sys.stdout.flush()


def _help() -> str:
    """The docstring with each paragraph on one line, so that the terminal wraps it (typer keeps line breaks)."""
    paragraphs = inspect.cleandoc(serve.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def register(app: typer.Typer) -> None:
    app.command("serve", help=_help())(serve)
