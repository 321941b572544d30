"""The `eaglewire` command: one module per subcommand group, each parses arguments and calls the library.

Every group module exposes `register(app)`. Library errors (`EaglewireError`) become exit code
2 with their message (expected vs actual, and the fix) instead of a traceback.
"""

from __future__ import annotations

import logging
import sys

import typer

from eaglewire.cli import common

app = typer.Typer(
    name="eaglewire",
    help="EAGLE-3 speculative decoding: train, prove the wiring, decode, export.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Order = order in --help.
_GROUPS = (
    "quickstart",
    "ids",
    "draft",
    "data",
    "train",
    "eval",
    "generate",
    "serve",
    "doctor",
    "export",
    "bench",
)


def _register_all() -> None:
    import importlib

    for name in _GROUPS:
        try:
            module = importlib.import_module(f"eaglewire.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"eaglewire.cli.{name}":
                continue  # group not written yet
            raise
        module.register(app)


_register_all()


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main() -> None:
    common.run_app(app)
