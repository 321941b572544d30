"""`eaglewire draft init`: an untrained EAGLE-3 draft for any supported target; `eaglewire draft
relabel`: a copy of a draft wired to other aux boundaries."""

from __future__ import annotations

from pathlib import Path

import typer

from eaglewire.cli.common import parse_int_list, print_table
from eaglewire.cli.flags import check_draft_mlp, draft_mlp_option, one_of
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import check_output_dir, fresh_output

draft_app = typer.Typer(help="Create and inspect draft models.", no_args_is_help=True)


@draft_app.command("init")
def init(
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    out: Path = typer.Option(..., "--out", help="directory to write the draft to"),
    aux_boundaries: str = typer.Option(
        None,
        "--aux-boundaries",
        help="aux boundaries (eaglewire numbering, see `eaglewire ids`); default 2,L//2,L-3",
    ),
    draft_vocab_size: int = typer.Option(
        None,
        "--draft-vocab-size",
        help="Vd; without --vocab-map the first Vd target ids are used (prefer a vocab map)",
    ),
    vocab_map: Path = typer.Option(
        None, "--vocab-map", help="vocab map from `eaglewire data vocab` (safetensors)"
    ),
    draft_intermediate_size: int = draft_mlp_option(),
    dtype: str = typer.Option("float32", "--dtype", help="dtype to run the target in for the fingerprint"),
    seed: int = typer.Option(0, "--seed"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier eaglewire draft in --out, as a whole (never another kind of directory)",
    ),
) -> None:
    """Write config.json + model.safetensors + contract.json for a fresh draft."""
    check_output_dir(out, OutputKind.DRAFT, force=force)  # first: a refusal costs nothing
    check_draft_mlp(draft_intermediate_size)

    import torch

    from eaglewire.data.vocab import read_vocab_map
    from eaglewire.draft.init import init_draft
    from eaglewire.draft.io import save_draft
    from eaglewire.errors import ConfigError
    from eaglewire.target.identity import build_contract
    from eaglewire.target.loading import load_target
    from eaglewire.tensor_checks import check_vocab_map

    d2t: torch.Tensor | None = None
    if vocab_map is not None:  # before the target loads: a bad map costs nothing
        d2t, _stats, map_file = read_vocab_map(vocab_map, flag="--vocab-map")
        if draft_vocab_size is not None and draft_vocab_size != len(d2t):
            raise ConfigError(
                f"--draft-vocab-size={draft_vocab_size} but --vocab-map {vocab_map} has {len(d2t)} ids",
                fix="drop --draft-vocab-size (the vocab map sets it)",
            )
    loaded = load_target(target, dtype=dtype, trust_remote_code=trust_remote_code)
    contract = build_contract(loaded, parse_int_list(aux_boundaries, what="--aux-boundaries"))
    if d2t is not None:
        check_vocab_map(
            d2t,
            loaded.vocab_size,
            where=f"--vocab-map {map_file}",
            error=ConfigError,
            fix="build the vocab map for this target (`eaglewire data vocab` on data tokenized with its tokenizer)",
        )
    elif draft_vocab_size is not None:
        d2t = torch.arange(draft_vocab_size)
    draft = init_draft(
        loaded, contract, draft_to_target=d2t, intermediate_size=draft_intermediate_size, seed=seed
    )
    with fresh_output(out, OutputKind.DRAFT, force=force) as tmp:
        save_draft(draft, contract, tmp)
    params = sum(p.numel() for n, p in draft.named_parameters() if not n.startswith("embed_tokens"))
    print_table(
        f"draft written to {out}",
        ["field", "value"],
        [
            [
                "target",
                f"{contract.target.architecture}, L={contract.target.num_layers}, Ht={contract.target.hidden_size}",
            ],
            ["aux boundaries", ", ".join(contract.describe()[: contract.num_aux])],
            ["fc", f"{contract.aux_width} -> {draft.config.hidden_size}"],
            ["MLP", f"{draft.config.hidden_size} -> {draft.config.intermediate_size}"],
            ["vocab", f"V={draft.config.vocab_size}, Vd={draft.config.draft_vocab_size}"],
            ["trainable params (without embeddings)", f"{params / 1e6:.2f} M"],
        ],
    )


@draft_app.command("relabel")
def relabel(
    draft: Path = typer.Option(..., "--draft", help="eaglewire draft directory (read, never written)"),
    target: str = typer.Option(
        ..., "--target", help="the draft's target: HF model directory, .gguf file, or 'smollm2'"
    ),
    aux_boundaries: str = typer.Option(
        ...,
        "--aux-boundaries",
        help="the boundaries the draft really reads, in order (eaglewire numbering; `eaglewire doctor` "
        "says which, from the draft's own accuracy)",
    ),
    out: Path = typer.Option(..., "--out", help="directory to write the relabelled draft to"),
    final_norm: str = typer.Option(
        None, "--final-norm", help="the final state 'pre' or 'post' the norm (default: the draft's)"
    ),
    final_boundary: int = typer.Option(
        None, "--final-boundary", help="the final state's boundary (default: the draft's)"
    ),
    dtype: str = typer.Option(
        None,
        "--dtype",
        help="the dtype the target runs in for the contract: float32 | bfloat16 | float16 (default: the draft's)",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier eaglewire draft in --out, as a whole (never another kind of directory)",
    ),
) -> None:
    """A new draft with the same config and weights and a contract rebuilt at other aux boundaries.

    For a draft trained on mislabelled data (the doctor tells by its accuracy): it learned the real states.
    """
    aux = parse_int_list(aux_boundaries, what="--aux-boundaries")
    if not aux:
        from eaglewire.errors import ConfigError

        raise ConfigError("--aux-boundaries: expected a comma-separated list like 3,5,6, got an empty one")
    one_of("--final-norm", final_norm, ("pre", "post"))
    one_of("--dtype", dtype, ("float32", "bfloat16", "float16"))
    from eaglewire.relabel.draft import check_num_aux, check_relabel_paths, read_draft_config

    check_relabel_paths(draft, out)  # first: a refusal costs nothing
    check_output_dir(out, OutputKind.DRAFT, force=force)
    cfg = read_draft_config(draft)
    check_num_aux(cfg, aux, draft)

    from eaglewire.contract.contract import Contract
    from eaglewire.contract.numbering import validate_boundaries
    from eaglewire.relabel.data import requested_final
    from eaglewire.relabel.draft import relabel_draft
    from eaglewire.target.loading import load_target

    old = Contract.load(draft)
    validate_boundaries(aux, old.target.num_layers, what="--aux-boundaries")
    final = requested_final(
        old.final,
        old.target.num_layers,
        boundary=final_boundary,
        norm="post" if final_norm == "post" else "pre" if final_norm else None,
    )
    loaded = load_target(target, dtype=dtype or old.dtype)
    result = relabel_draft(draft, loaded, aux, out, final=final, force=force, target_arg=target)
    L = result.new.target.num_layers
    print_table(
        f"relabelled draft written to {out} (config.json and model.safetensors copied from {draft})",
        ["field", "was", "now"],
        [
            ["aux boundaries", list(result.old.aux_boundaries), list(result.new.aux_boundaries)],
            [
                "final",
                f"boundary {result.old.final.boundary} {result.old.final.norm}-norm",
                f"boundary {result.new.final.boundary} {result.new.final.norm}-norm",
            ],
            ["dtype", result.old.dtype, result.new.dtype],
            ["target", result.old.target.name, f"{result.new.target.name} (L={L})"],
        ],
        caption="serve it with the ids `eaglewire ids` gives for the new boundaries (`eaglewire export` writes them)",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(draft_app, name="draft")
