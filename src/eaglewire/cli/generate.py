"""`eaglewire generate`: speculative decoding with a draft, optionally proving it lossless."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from eaglewire.cli.common import DEVICE_HELP, EXIT_FINDING, print_json, print_table, resolve_device
from eaglewire.cli.flags import SPEC_OPTIONS, at_least, in_range, one_of, spec_args_from_options
from eaglewire.errors import ConfigError, DataFormatError

# torch.Generator takes a signed 64-bit seed; the draft's generator uses seed + 1.
MAX_SEED = 2**63 - 2

if TYPE_CHECKING:
    from eaglewire.engine.api import GenerationResult, SpeculativeDecoder
    from eaglewire.engine.spec_args import SpecArgs


def read_prompts(prompt: str | None, prompts_file: Path | None) -> list[str]:
    """Exactly one of --prompt / --prompts-file. A .jsonl file holds {"prompt": ...} objects (or
    strings), one per line; any other file holds one prompt per non-empty line."""
    if (prompt is None) == (prompts_file is None):
        raise ConfigError("pass exactly one of --prompt TEXT or --prompts-file F")
    if prompt is not None:
        return [prompt]
    assert prompts_file is not None
    if not prompts_file.is_file():
        raise ConfigError(f"--prompts-file {prompts_file}: no such file")
    try:  # utf-8-sig: a byte-order mark an editor wrote is not part of the first prompt
        lines = prompts_file.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise DataFormatError(
            f"--prompts-file {prompts_file}: invalid UTF-8 at byte {e.start}",
            fix="re-encode the file as UTF-8",
        ) from None
    prompts = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if prompts_file.suffix != ".jsonl":
            prompts.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{prompts_file}:{lineno}: invalid JSON ({e.msg})") from None
        if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            prompts.append(obj["prompt"])
        elif isinstance(obj, str):
            prompts.append(obj)
        else:
            raise DataFormatError(f'{prompts_file}:{lineno}: expected {{"prompt": "..."}} or a JSON string')
    if not prompts:
        raise DataFormatError(f"{prompts_file}: no prompts")
    return prompts


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where the two token lists differ (or one ends), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _row(i: int, r: GenerationResult) -> list[Any]:
    acc = " ".join(f"{a:.2f}" for a in r.per_position_acceptance)
    return [i, len(r.token_ids), f"{r.tau:.2f}", acc, f"{r.tokens_per_s:.1f}", r.finish_reason]


@SPEC_OPTIONS.add_to(before="temperature")
def generate(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    draft: Path = typer.Option(
        None,
        "--draft",
        help="draft directory (config.json, model.safetensors, contract.json); omit for plain decoding",
    ),
    prompt: str = typer.Option(None, "--prompt", help="one prompt (the chat template is applied)"),
    prompts_file: Path = typer.Option(
        None, "--prompts-file", help='one prompt per line, or .jsonl with {"prompt": ...}'
    ),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_p: float = typer.Option(1.0, "--top-p", help="nucleus sampling mass"),
    seed: int = typer.Option(0, "--seed", help="seed for sampling"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="tokens to generate per prompt at most"),
    stop: list[str] = typer.Option([], "--stop", help="stop string (repeatable); the text is cut before it"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 (target and draft)"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    runner: str = typer.Option("auto", "--runner", help="target runtime: auto | fast | hf (full recompute)"),
    raw: bool = typer.Option(False, "--raw", help="do not apply the chat template"),
    check_lossless: bool = typer.Option(
        False, "--check-lossless", help="also decode without the draft; exit 1 at the first differing token"
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    **spec_options: int,
) -> None:
    """Decode prompts with a draft (EAGLE-3 chain or tree); report tau and per-position acceptance.

    Example: eaglewire generate --target smollm2 --draft runs/draft --prompt "Hi!" --check-lossless
    """
    # Every flag is checked before any work (no torch imported, no model loaded).
    one_of("--dtype", dtype, ("float32", "bfloat16"))
    one_of("--runner", runner, ("auto", "fast", "hf"))
    at_least("--max-new-tokens", max_new_tokens, 1, "tokens generated per prompt at most")
    at_least("--temperature", temperature, 0.0, "0 = greedy")
    in_range("--top-p", top_p, 0.0, 1.0, low_open=True, meaning="nucleus mass; 1 = no cut")
    in_range("--seed", seed, 0, MAX_SEED)
    if any(s == "" for s in stop):
        raise ConfigError("--stop: an empty stop string matches before the first token", fix="drop --stop ''")
    spec = spec_args_from_options(spec_options)
    if check_lossless and temperature != 0.0:
        raise ConfigError(
            f"--check-lossless compares greedy outputs, but --temperature={temperature}",
            fix="drop --temperature",
        )
    prompts = read_prompts(prompt, prompts_file)
    device = resolve_device(device)
    from eaglewire.engine.plain import generate_plain  # here, not at import: torch loads only when needed
    from eaglewire.engine.sampling import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
    all_ids, decoder = _load_checked(
        target, draft, prompts, "--prompt" if prompts_file is None else f"--prompts-file {prompts_file}",
        spec=spec, max_new_tokens=max_new_tokens, chat=not raw, dtype=dtype, device=device, runner=runner,
    )  # fmt: skip

    records: list[dict[str, Any]] = []
    rows, mismatches = [], []
    for i, (text, prompt_ids) in enumerate(zip(prompts, all_ids, strict=True)):
        result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop)
        record: dict[str, Any] = {"prompt": text, **result.to_json()}
        if check_lossless:
            # Plain greedy decoding by the plain-decoding loop on the same runner (no draft anywhere).
            eos = sorted(decoder.eos_token_ids)
            plain = generate_plain(decoder.runner, [prompt_ids], max_new_tokens, eos_token_ids=eos)[0]
            if result.finish_reason == "stop_string":  # plain decoding knows no stop strings
                plain = plain[: len(result.token_ids)]
            diff = first_difference(result.token_ids, plain)
            record["lossless"] = diff is None
            if diff is not None:
                mismatch = {
                    "prompt_index": i,
                    "position": diff,
                    "speculative": result.token_ids[diff] if diff < len(result.token_ids) else None,
                    "plain": plain[diff] if diff < len(plain) else None,
                    "common_prefix": decoder.tokenizer.decode(result.token_ids[:diff])
                    if decoder.tokenizer
                    else "",
                }
                record["first_difference"] = mismatch
                mismatches.append(mismatch)
        records.append(record)
        rows.append(_row(i, result))
        if not as_json:
            typer.echo(f"--- prompt {i}: {text!r}\n{result.text}\n")

    if as_json:
        print_json(
            {
                "spec": {
                    "num_steps": spec.num_steps,
                    "topk": spec.topk,
                    "num_draft_tokens": spec.num_draft_tokens,
                },
                "results": records,
            }
        )
    else:
        print_table(
            "speculative decoding" if draft is not None else "plain decoding (no draft)",
            ["prompt", "tokens", "tau", "acceptance per position", "tok/s", "finish"],
            rows,
        )
        if check_lossless and not mismatches:
            typer.echo(f"lossless: speculative == plain greedy for all {len(prompts)} prompt(s)")
    for m in mismatches:
        typer.echo(
            f"NOT LOSSLESS: prompt {m['prompt_index']} differs at generated token {m['position']}: "
            f"speculative={m['speculative']} plain={m['plain']} after {m['common_prefix']!r}",
            err=True,
        )
    if mismatches:
        raise typer.Exit(EXIT_FINDING)


def _load_checked(
    target: str, draft: Path | None, prompts: list[str], where: str, *, spec: SpecArgs, max_new_tokens: int,
    chat: bool, dtype: str, device: str, runner: str,
) -> tuple[list[list[int]], SpeculativeDecoder]:  # fmt: skip
    """Every prompt tokenized and checked against the target's positions (`engine.fits`) before its
    weights load where its directory's tokenizer allows, and against the runner's before any decoding;
    the decoder's runner sized for the longest (beyond the default 4096 only when a prompt needs it)."""
    from eaglewire.engine.api import SpeculativeDecoder, encode_text
    from eaglewire.engine.fits import ContextFit, model_positions
    from eaglewire.engine.runners.factory import DEFAULT_MAX_SEQ_LEN
    from eaglewire.target.loading import load_target, preview_target

    tree_tokens = spec.num_draft_tokens if draft is not None else 0
    preview = preview_target(target)
    tokenizer = None if preview is None else preview.tokenizer
    ids: list[list[int]] = []
    if preview is not None and tokenizer is not None:
        ids = [encode_text(tokenizer, text, chat=chat) for text in prompts]
        fit = ContextFit.of(positions=model_positions(preview.config), capacity=None, tree_tokens=tree_tokens)
        fit.check_all([(str(i), len(p)) for i, p in enumerate(ids)], max_new_tokens, where=where)
    loaded = load_target(target, dtype=dtype, device=device, tokenizer=tokenizer)
    if not ids:  # a .gguf target: its tokenizer came with the weights
        ids = [encode_text(loaded.tokenizer, text, chat=chat) for text in prompts]
    needed = max(len(p) for p in ids) + max_new_tokens + tree_tokens
    decoder = SpeculativeDecoder.load(
        loaded, draft, spec=spec, runner=runner,  # type: ignore[arg-type]
        max_seq_len=None if needed <= DEFAULT_MAX_SEQ_LEN else needed,
    )  # fmt: skip
    decoder.context_fit().check_all(
        [(str(i), len(p)) for i, p in enumerate(ids)], max_new_tokens, where=where
    )
    return ids, decoder


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
