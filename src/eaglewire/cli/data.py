"""`eaglewire data ...`: regenerate, build, vocab, capture, inspect, import."""

from __future__ import annotations

from pathlib import Path

import typer

from eaglewire.cli.common import DEVICE_HELP, parse_int_list, print_json, print_table, resolve_device
from eaglewire.cli.data_regenerate import INPUT_HELP, SPLIT_HELP, regenerate_cmd, tokenizer_for
from eaglewire.cli.flags import at_least, one_of
from eaglewire.data.batching import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PACE_BATCHES,
    DEFAULT_SHARD_RECORDS,
)
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import check_output_dir, check_resumable_dir

data_app = typer.Typer(
    help="Training data: regenerate answers, tokenize, vocab map, capture, import.", no_args_is_help=True
)

# regenerate first: the order of --help
data_app.command("regenerate")(regenerate_cmd)


@data_app.command("build")
def build_cmd(
    target: str = typer.Option(
        ..., "--target", help="model directory or 'smollm2' (only its tokenizer is loaded)"
    ),
    input: str = typer.Option(..., "--input", help=INPUT_HELP),
    out: Path = typer.Option(..., "--out", help="dataset directory to write"),
    max_length: int = typer.Option(
        2048, "--max-length", help="tokens per record; longer ones are truncated (counted)"
    ),
    split: str = typer.Option("train", "--split", help=SPLIT_HELP),
    chat_template: str = typer.Option(
        None, "--chat-template", help="Jinja file (or text) replacing the tokenizer's"
    ),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="skip (and count) malformed lines instead of failing"
    ),
    limit: int = typer.Option(None, "--limit"),
    json_out: bool = typer.Option(False, "--json", help="print the counts as JSON"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier dataset in --out as a whole (a vocabulary beside it goes too; never another "
        "kind of directory)",
    ),
) -> None:
    """Tokenize with the chat template; loss mask on assistant tokens (by character offsets)."""
    check_output_dir(out, OutputKind.DATASET, force=force)  # first: a refusal costs nothing
    at_least("--limit", limit, 1, "use the first N conversations; omit it for all")
    at_least("--max-length", max_length, 2, "tokens per record")
    from dataclasses import asdict

    from eaglewire.data.build import build_dataset, check_heldout, load_source, save_dataset
    from eaglewire.data.builtin import parse_split

    convs, read_stats = load_source(
        input, split=parse_split(split), require_assistant=True, skip_bad=skip_bad, limit=limit
    )
    # before the tokenizer loads: a held-out record is refused at once (build_dataset checks again)
    check_heldout([c.record_id for c in convs], split, where=input)
    ds, stats = build_dataset(
        convs,
        tokenizer_for(target),
        chat_template=chat_template,
        max_length=max_length,
        split=parse_split(split),
        skip_bad=skip_bad,
        read_stats=read_stats,
        source=input,
        show_progress=progress,
    )
    save_dataset(ds, out, force=force)
    counts = {**read_stats.to_json(), **asdict(stats)}
    if json_out:
        print_json(counts)
        return
    print_table(
        f"dataset written to {out}", ["count", "value"], [[k, v] for k, v in counts.items() if k != "lines"]
    )


@data_app.command("vocab")
def vocab_cmd(
    dataset: Path = typer.Option(..., "--dataset", help="dataset directory from `eaglewire data build`"),
    draft_vocab_size: int = typer.Option(..., "--draft-vocab-size", help="Vd"),
    vocab_size: int = typer.Option(
        None, "--vocab-size", help="target V (default: the tokenizer's, recorded at build)"
    ),
    out: Path = typer.Option(
        None, "--out", help="directory for draft_vocab.safetensors (default: the dataset's)"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier vocabulary (beside the dataset, or in --out as a whole)",
    ),
) -> None:
    """Top-Vd loss-masked target tokens (special tokens kept) -> draft_vocab.safetensors."""
    beside = out is None or out.resolve() == dataset.resolve()
    if not beside:  # first: a refusal costs nothing
        check_output_dir(out, OutputKind.VOCAB, force=force)
    from eaglewire.data.records import TokenizedDataset
    from eaglewire.data.vocab import (
        build_draft_vocab,
        check_vocab_beside_dataset,
        save_draft_vocab,
        save_vocab_beside_dataset,
    )

    if beside:
        check_vocab_beside_dataset(dataset, force=force)
    ds = TokenizedDataset.load(dataset)
    vocab = build_draft_vocab(ds, draft_vocab_size, vocab_size=vocab_size)
    if beside:
        path = save_vocab_beside_dataset(vocab, dataset, force=force)
    else:
        path = save_draft_vocab(vocab, out, force=force)
    s = vocab.stats
    print_table(
        f"draft vocabulary written to {path}",
        ["field", "value"],
        [
            ["Vd / V", f"{s['draft_vocab_size']} / {s['vocab_size']}"],
            ["coverage of loss tokens", f"{100 * s['coverage']:.2f}%"],
            ["distinct loss tokens", s["distinct_loss_tokens"]],
            ["special ids kept", len(s["special_ids_kept"])],
            ["filled with unseen ids (ascending)", s["filled_unseen"]],
        ],
    )


@data_app.command("capture")
def capture_cmd(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    dataset: Path = typer.Option(..., "--dataset", help="dataset directory from `eaglewire data build`"),
    out: Path = typer.Option(..., "--out", help="shard directory (rerun the same command to resume)"),
    aux_boundaries: str = typer.Option(
        None, "--aux-boundaries", help="eaglewire boundaries; default 2,L//2,L-3"
    ),
    final_norm: str = typer.Option(
        "pre", "--final-norm", help="final state before ('pre') or after ('post') the norm"
    ),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, "--batch-size", help="records per forward at most"),
    max_batch_tokens: int = typer.Option(
        DEFAULT_MAX_BATCH_TOKENS,
        "--max-batch-tokens",
        help="padded tokens per forward at most (lower it if the target runs out of GPU memory)",
    ),
    shard_records: int = typer.Option(
        DEFAULT_SHARD_RECORDS, "--shard-records", help="records per shard file"
    ),
    write_workers: int = typer.Option(
        8, "--write-workers", help="threads writing shards while the target computes the next ones"
    ),
    pace_batches: int = typer.Option(
        DEFAULT_PACE_BATCHES,
        "--pace-batches",
        help="keep the launches at most N batches ahead of the GPU, so the writer threads get the GIL "
        "while the host waits (0 = never wait)",
    ),
    dtype: str = typer.Option("bfloat16", "--dtype"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Capture the contract's hidden states into safetensors shards + manifest.json."""
    check_resumable_dir(out, OutputKind.SHARDS)  # first: a refusal costs nothing
    from eaglewire.data.capture import capture_dataset, human_bytes
    from eaglewire.data.records import TokenizedDataset
    from eaglewire.errors import ConfigError
    from eaglewire.target.loading import load_target

    if final_norm not in ("pre", "post"):
        raise ConfigError(f"--final-norm: expected 'pre' or 'post', got {final_norm!r}")
    loaded = load_target(target, dtype=dtype, device=resolve_device(device))
    ds = TokenizedDataset.load(dataset)
    stats = capture_dataset(
        loaded,
        ds,
        out,
        aux_boundaries=parse_int_list(aux_boundaries, what="--aux-boundaries"),
        final_norm="post" if final_norm == "post" else "pre",
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        shard_records=shard_records,
        source=str(dataset),
        show_progress=progress,
        write_workers=write_workers,
        pace_batches=pace_batches,
    )
    print_table(
        f"shards written to {out}",
        ["field", "value"],
        [
            ["records / tokens (this run)", f"{stats.records} / {stats.tokens}"],
            ["shards written / resumed", f"{stats.shards_written} / {stats.shards_resumed}"],
            [
                "estimated / written",
                f"{human_bytes(stats.estimated_bytes)} / {human_bytes(stats.written_bytes)}",
            ],
            ["throughput", f"{stats.tokens_per_second:.0f} tok/s"],
        ],
    )


@data_app.command("relabel")
def relabel_cmd(
    data: Path = typer.Option(
        ..., "--data", help="shard directory from `eaglewire data capture` (or import)"
    ),
    target: str = typer.Option(
        ...,
        "--target",
        help="the target the data was captured from: HF model directory, .gguf file, or 'smollm2'",
    ),
    aux_boundaries: str = typer.Option(
        ...,
        "--aux-boundaries",
        help="what the stored aux columns really are, in order (eaglewire boundaries; `eaglewire doctor --data` "
        "says)",
    ),
    final_norm: str = typer.Option(
        None, "--final-norm", help="the final state is 'pre' or 'post' the norm (default: as labelled now)"
    ),
    final_boundary: int = typer.Option(
        None, "--final-boundary", help="the final state's boundary (default: as labelled now)"
    ),
    dtype: str = typer.Option(
        None,
        "--dtype",
        help="the dtype the target ran in when the states were captured: float32 | bfloat16 | float16 "
        "(default: as labelled now); the target runs in it for the check",
    ),
    max_records: int = typer.Option(
        4, "--max-records", help="records whose states are recomputed and compared"
    ),
    max_tokens: int = typer.Option(128, "--max-tokens", help="tokens per record compared"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
) -> None:
    """Correct the labels of shards whose tensors are right, proven by values on the live target first.

    Each column must be, by values, the state it is to be called; contract.json and manifest.json are
    then rewritten (a contract built on the target). The shards are not touched. Idempotent.
    """
    aux = parse_int_list(aux_boundaries, what="--aux-boundaries")
    if not aux:
        from eaglewire.errors import ConfigError

        raise ConfigError("--aux-boundaries: expected a comma-separated list like 3,5,6, got an empty one")
    one_of("--final-norm", final_norm, ("pre", "post"))
    one_of("--dtype", dtype, ("float32", "bfloat16", "float16"))
    at_least("--max-records", max_records, 1)
    at_least("--max-tokens", max_tokens, 3)
    from eaglewire.relabel.data import (
        check_data_request,
        describe,
        open_shards,
        relabel_data,
        requested_final,
    )
    from eaglewire.target.loading import load_target

    dataset = open_shards(data)  # before the target loads: a wrong directory or list costs nothing
    old = dataset.contract
    check_data_request(old, aux, data)
    final = requested_final(
        old.final,
        old.target.num_layers,
        boundary=final_boundary,
        norm="post" if final_norm == "post" else "pre" if final_norm else None,
    )
    loaded = load_target(target, dtype=dtype or old.dtype, device=resolve_device(device))
    result = relabel_data(
        dataset, loaded, aux, final=final, target_arg=target, max_records=max_records, max_tokens=max_tokens
    )
    print_table(
        (f"relabelled: {', '.join(result.written)} rewritten (the shards are untouched)"
         if result.written else "already labelled so: nothing written"),
        ["state", "was labelled", "now labelled (proven by values)"],
        describe(result),
        caption=f"{data}; " + (result.wiring.result.notes[-1] if result.wiring.result.notes else ""),
    )  # fmt: skip


@data_app.command("inspect")
def inspect_cmd(
    path: Path = typer.Argument(..., help="dataset directory or shard directory"),
    index: int = typer.Option(None, "--index", help="record index (default 0)"),
    record_id: str = typer.Option(None, "--id", help="record id"),
    target: str = typer.Option(
        None, "--target", help="tokenizer source for token text (default: the recorded one)"
    ),
    max_tokens: int = typer.Option(64, "--max-tokens", help="rows shown in the table"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """One record: tokens, loss mask and, for shards, the norm of each token at each boundary."""
    from eaglewire.data.inspect import inspect_record, recorded_tokenizer_path

    tok_src = target or recorded_tokenizer_path(path)
    info = inspect_record(
        path, index=index, record_id=record_id, tokenizer=tokenizer_for(tok_src) if tok_src else None
    )
    if json_out:
        print_json(info)
        return
    print_table(
        f"{info['record_id']} (#{info['index']}, {info['num_tokens']} tokens, {info['loss_tokens']} in the loss)",
        ["pos", "id", "text", "loss", *[f"|{b}|" for b in info["boundaries"]]],
        [
            [
                t["pos"],
                t["id"],
                repr(t["text"]) if t["text"] is not None else "",
                "x" if t["loss"] else "",
                *t.get("norms", []),
            ]
            for t in info["tokens"][:max_tokens]
        ],
    )
    if info["norm_summary"]:
        print_table(
            "per-boundary token norms",
            ["state", "mean", "min", "max"],
            [
                [k, f"{v['mean']:.3f}", f"{v['min']:.3f}", f"{v['max']:.3f}"]
                for k, v in info["norm_summary"].items()
            ],
        )


@data_app.command("import")
def import_cmd(
    engine: str = typer.Option(..., "--engine", help="speculators (vLLM extract_hidden_states) or specforge"),
    source: Path = typer.Option(..., "--source", help="directory the engine wrote (safetensors only)"),
    out: Path = typer.Option(..., "--out", help="shard directory to write"),
    target: Path = typer.Option(
        ..., "--target", help="the target's model directory (config + tokenizer; no weights read)"
    ),
    layer_ids: str = typer.Option(
        None, "--layer-ids", help="ids the engine captured, in ITS numbering (default: its defaults)"
    ),
    masks: Path = typer.Option(
        None, "--masks", help="speculators: dataset dir or JSONL rows with input_ids+loss_mask"
    ),
    all_tokens_loss: bool = typer.Option(
        False, "--all-tokens-loss", help="speculators without masks: loss on every token"
    ),
    shard_records: int = typer.Option(
        DEFAULT_SHARD_RECORDS, "--shard-records", help="records per shard file"
    ),
    verify: bool = typer.Option(False, "--verify", help="load the target and check the stated ids by values"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="dtype for --verify"),
) -> None:
    """Convert another engine's offline hidden states into eaglewire shards with our manifest."""
    check_resumable_dir(out, OutputKind.SHARDS)  # first: a refusal costs nothing
    from eaglewire.data.importers import import_hidden_states
    from eaglewire.target.loading import load_target

    stats = import_hidden_states(
        engine,
        source,
        out,
        target_dir=target,
        layer_ids=parse_int_list(layer_ids, what="--layer-ids"),
        masks=masks,
        all_tokens_loss=all_tokens_loss,
        shard_records=shard_records,
        verify_target=load_target(target, dtype=dtype) if verify else None,
    )
    print_table(
        f"imported into {out}",
        ["field", "value"],
        [["records", stats.records], ["tokens", stats.tokens], ["shards", stats.shards]],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
