"""`eaglewire draft init`: an untrained EAGLE-3 draft for any supported target."""

from __future__ import annotations

from pathlib import Path

import typer

from eaglewire.cli.common import parse_int_list, print_table
from eaglewire.outputs import OutputKind, check_output_dir, fresh_output

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
    draft_intermediate_size: int = typer.Option(
        None, "--draft-intermediate-size", help="the draft layer's MLP width (default: the target's)"
    ),
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


def register(app: typer.Typer) -> None:
    app.add_typer(draft_app, name="draft")
