"""`eaglewire ids`: convert aux layer ids between every engine's numbering."""

from __future__ import annotations

from typing import Any

import typer

from eaglewire.cli.common import EXIT_INVALID_INPUT, parse_int_list, print_json, print_table
from eaglewire.contract.numbering import (
    NUMBERING_SHORT,
    SGLANG_ANY,
    SGLANG_GENERATION_HELP,
    SGLANG_GENERATIONS,
    Numbering,
    describe_boundary,
    engine_ids_table,
    parse_numbering,
    read_sglang_both,
    to_boundaries,
)
from eaglewire.errors import BoundaryError

_NUMBERING_NAMES = ", ".join(m.value for m in Numbering)


def _boundary_rows(boundaries: tuple[int, ...], num_layers: int) -> list[list[Any]]:
    return [[i, b, describe_boundary(b, num_layers)] for i, b in enumerate(boundaries)]


def _report(boundaries: tuple[int, ...], num_layers: int, title: str, as_json: bool) -> dict[str, Any]:
    table = engine_ids_table(boundaries, num_layers)
    result = {
        "boundaries": list(boundaries),
        "meaning": [describe_boundary(b, num_layers) for b in boundaries],
        "engine_ids": {k: (list(v) if isinstance(v, tuple) else v) for k, v in table.items()},
    }
    if not as_json:
        print_table(title, ["aux", "boundary", "physical state"], _boundary_rows(boundaries, num_layers))
        rows = [
            [k, ",".join(map(str, v)) if isinstance(v, tuple) else v, NUMBERING_SHORT[Numbering(k)]]
            for k, v in table.items()
        ]
        print_table("ids to write", ["engine / tool", "ids", "reading"], rows)
    return result


def ids(
    ids_text: str = typer.Argument(
        None, metavar="IDS", help="comma-separated ids, e.g. 3,31,59; omit for the defaults"
    ),
    num_layers: int = typer.Option(..., "--num-layers", "-L", help="decoder layers L of the target"),
    numbering: str = typer.Option(
        "boundary", "--from", help=f"numbering of IDS: {_NUMBERING_NAMES}, or '{SGLANG_ANY}'"
    ),
    sglang_generation: str = typer.Option(
        None,
        "--sglang-version",
        "--sglang-generation",
        help=f"with --from sglang: legacy | pr25454. {SGLANG_GENERATION_HELP}",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show which physical states some layer ids name, and the ids every engine needs for them.

    Example: eaglewire ids --num-layers 61 --from vllm 3,31,59
    """
    if num_layers <= 0:
        raise BoundaryError(f"--num-layers: expected a positive integer, got {num_layers}")
    values = parse_int_list(ids_text, what="IDS")
    if sglang_generation is not None and sglang_generation not in SGLANG_GENERATIONS:
        raise BoundaryError(
            f"--sglang-version: expected one of {sorted(SGLANG_GENERATIONS)}, got {sglang_generation!r}"
        )

    if numbering == SGLANG_ANY and values is not None and sglang_generation is None:
        both = read_sglang_both(values, num_layers)
        out: dict[str, Any] = {
            "ids": values,
            "numbering": "sglang",
            "ambiguous": both.ambiguous,
            "readings": {},
        }
        for gen, bs, err in (
            ("legacy", both.legacy, both.legacy_error),
            ("pr25454", both.pr25454, both.pr25454_error),
        ):
            label = "releases before PR #25454" if gen == "legacy" else "releases with PR #25454 (2026-05-16)"
            if bs is None:
                out["readings"][gen] = {"error": err}
                if not as_json:
                    typer.echo(f"{label}: invalid: {err}")
                continue
            out["readings"][gen] = _report(bs, num_layers, f"SGLang {label} read {values} as", as_json)
        if not as_json:
            if both.ambiguous:
                typer.echo(
                    f"\nThe two SGLang generations read {values} differently. {SGLANG_GENERATION_HELP}. "
                    "Pass --sglang-version legacy|pr25454 to pick one."
                )
            else:
                typer.echo("\nBoth SGLang generations read these ids alike.")
        else:
            print_json(out)
        if both.legacy is None and both.pr25454 is None:
            raise typer.Exit(EXIT_INVALID_INPUT)
        return

    source = SGLANG_GENERATIONS[sglang_generation] if numbering == SGLANG_ANY else parse_numbering(numbering)
    boundaries = to_boundaries(values, source, num_layers)
    title = (
        f"defaults for L={num_layers}"
        if values is None
        else f"{source.value} ids {values} (L={num_layers}) name"
    )
    result = _report(boundaries, num_layers, title, as_json)
    if as_json:
        print_json({"ids": values, "numbering": source.value, **result})


def register(app: typer.Typer) -> None:
    app.command("ids")(ids)
