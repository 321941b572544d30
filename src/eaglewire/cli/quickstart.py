"""`eaglewire quickstart`: the whole pipeline on the reference target, with a summary at the end."""

from __future__ import annotations

import typer

from eaglewire.cli.common import console, print_table


def show_target_report(report) -> None:  # type: ignore[no-untyped-def]
    c = report.contract
    print_table(
        f"contract: {c.target.architecture}, L={c.target.num_layers}, Ht={c.target.hidden_size}, V={c.target.vocab_size}",
        ["field", "value"],
        [["aux", line] for line in c.describe()[: c.num_aux]] + [["final", c.describe()[-1]], ["dtype", c.dtype]],
    )
    print_table(
        "aux layer ids to write per engine",
        ["engine / tool", "ids"],
        [[k, ",".join(map(str, v)) if isinstance(v, tuple) else v] for k, v in report.engine_ids.items()],
    )
    print_table(
        "mean per-token norm at every boundary (probe prompt)",
        ["boundary", "physical state", "norm", "role"],
        [
            [f"{n.key.boundary}{' post' if n.key.norm == 'post' else ''}", n.meaning, f"{n.mean_token_norm:.2f}",
             "aux" if n.is_aux else ("final" if n.is_final else "")]
            for n in report.norms
        ],
    )


def quickstart(
    target: str = typer.Option("smollm2", "--target", help="target to run the pipeline on"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 on CPU; bfloat16 on GPU"),
) -> None:
    """Fresh machine -> reference target -> contract and wiring report (later stages: train, decode, export)."""
    from eaglewire.recipes.inspect_target import inspect_target
    from eaglewire.target.loading import load_target

    console.print(f"[bold]1/1 loading target[/] {target} ({dtype})")
    loaded = load_target(target, dtype=dtype)
    show_target_report(inspect_target(loaded))


def register(app: typer.Typer) -> None:
    app.command("quickstart")(quickstart)
