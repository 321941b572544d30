"""`eaglewire ids`: convert aux layer ids between every engine's numbering.

SGLang's reading of an id depends on the release and the target architecture
(`eaglewire.contract.numbering.ENGINE_RULES`): `--from sglang` needs `--arch`, and shows every
release eaglewire has read unless `--sglang-version` names one.
"""

from __future__ import annotations

from typing import Any

import typer

from eaglewire.cli.common import EXIT_INVALID_INPUT, parse_int_list, print_json, print_table
from eaglewire.contract.numbering import (
    ENGINE_NAMES,
    VERSION_FLAGS,
    Engine,
    EngineReading,
    Numbering,
    describe_boundary,
    engine_ids_rows,
    engine_readings,
    family_of,
    parse_numbering,
    read_versions,
    to_boundaries,
)
from eaglewire.errors import BoundaryError

_FROM_NAMES = ", ".join([*(m.value for m in Numbering), Engine.SGLANG.value])


def _boundary_rows(boundaries: tuple[int, ...], num_layers: int) -> list[list[Any]]:
    return [[i, b, describe_boundary(b, num_layers)] for i, b in enumerate(boundaries)]


def _report(
    boundaries: tuple[int, ...], num_layers: int, title: str, as_json: bool, architecture: str | None
) -> dict[str, Any]:
    rows = engine_ids_rows(boundaries, num_layers, architecture)
    result = {
        "boundaries": list(boundaries),
        "meaning": [describe_boundary(b, num_layers) for b in boundaries],
        "engine_ids": {r.label: (list(r.ids) if r.ids is not None else r.why) for r in rows},
    }
    if not as_json:
        print_table(title, ["aux", "boundary", "physical state"], _boundary_rows(boundaries, num_layers))
        print_table(
            "ids to write"
            + (f" ({architecture} target)" if architecture else " (--arch shows each release)"),
            ["engine / tool", "ids", "reading"],
            [[r.label, ",".join(map(str, r.ids)) if r.ids is not None else "-", r.why] for r in rows],
        )
    return result


def _engine_reading_json(r: EngineReading) -> dict[str, Any]:
    return {
        "boundaries": None if r.boundaries is None else list(r.boundaries),
        "problem": r.problem,
        "rule": None if r.rule.numbering is None else r.rule.numbering.value,
        "source": r.rule.source,
    }


def ids(
    ids_text: str = typer.Argument(
        None, metavar="IDS", help="comma-separated ids, e.g. 3,31,59; omit for the defaults"
    ),
    num_layers: int = typer.Option(..., "--num-layers", "-L", help="decoder layers L of the target"),
    numbering: str = typer.Option("boundary", "--from", help=f"numbering of IDS: {_FROM_NAMES}"),
    arch: str = typer.Option(
        None,
        "--arch",
        help="the target's architecture (config.json architectures[0], e.g. Qwen3ForCausalLM): SGLang's id rule "
        "depends on it; with it, the ids each engine release needs are shown",
    ),
    sglang_version: str = typer.Option(
        None,
        "--sglang-version",
        help="with --from sglang: the SGLang release, e.g. 0.5.23 (default: every one read)",
    ),
    vllm_version: str = typer.Option(
        None, "--vllm-version", help="with --from vllm --arch: the vLLM release, e.g. 0.33.0"
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show which physical states some layer ids name, and the ids every engine needs for them.

    Example: eaglewire ids --num-layers 36 --from sglang --arch Qwen3ForCausalLM --sglang-version 0.5.23 3,17,32
    """
    if num_layers <= 0:
        raise BoundaryError(f"--num-layers: expected a positive integer, got {num_layers}")
    values = parse_int_list(ids_text, what="IDS")
    if arch is not None:
        family_of(arch)  # refuses an unknown architecture before any work
    for flag, value, named in (
        ("--sglang-version", sglang_version, Engine.SGLANG),
        ("--vllm-version", vllm_version, Engine.VLLM),
    ):
        if value is not None and numbering != named.value:
            raise BoundaryError(
                f"{flag} {value} given with --from {numbering}: it names how {ENGINE_NAMES[named]} reads ids",
                fix=f"use --from {named.value} --arch ARCH with {flag}",
            )
    engine = Engine(numbering) if numbering in (Engine.SGLANG.value, Engine.VLLM.value) else None
    if engine is Engine.SGLANG and arch is None:
        raise BoundaryError(
            "--from sglang: SGLang's reading of an id depends on the target architecture (and the release)",
            fix="add --arch with the target's config.json architectures[0], e.g. --arch LlamaForCausalLM",
        )
    if engine is None or arch is None:
        source = parse_numbering(numbering, flag="--from")
        boundaries = to_boundaries(values, source, num_layers)
        title = (
            f"defaults for L={num_layers}"
            if values is None
            else f"{source.value} ids {values} (L={num_layers}) name"
        )
        result = _report(boundaries, num_layers, title, as_json, arch)
        if as_json:
            print_json({"ids": values, "numbering": source.value, "architecture": arch, **result})
        return

    version = sglang_version if engine is Engine.SGLANG else vllm_version
    readings = engine_readings(engine, arch, values, num_layers, version)
    out: dict[str, Any] = {
        "ids": values,
        "numbering": engine.value,
        "architecture": arch,
        "readings": {r.label: _engine_reading_json(r) for r in readings},
    }
    if not as_json:
        for r in readings:
            typer.echo(r.text())
    distinct = {(r.boundaries, r.problem) for r in readings}
    usable = [r for r in readings if r.boundaries is not None]
    if len(distinct) > 1 and not as_json:
        typer.echo(
            f"\nThe {ENGINE_NAMES[engine]} releases eaglewire has read ({read_versions(engine, arch)}) read "
            f"{values if values is not None else 'the defaults'} differently on {arch}: pass "
            f"{VERSION_FLAGS[engine]} to pick yours."
        )
    shown = usable[-1] if usable else None  # the newest release range's capture, in layer order
    if shown is not None and shown.boundaries:
        ranges = ", ".join(r.rule.versions for r in readings)
        label = shown.label if len(distinct) > 1 else f"{ENGINE_NAMES[engine]} {ranges}"
        out.update(_report(shown.boundaries, num_layers, f"{label} captures", as_json, arch))
    if as_json:
        print_json(out)
    if not usable or all(r.problem for r in readings):
        raise typer.Exit(EXIT_INVALID_INPUT)


def register(app: typer.Typer) -> None:
    app.command("ids")(ids)
