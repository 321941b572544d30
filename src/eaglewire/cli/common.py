"""Shared CLI plumbing: error-to-exit-code mapping, JSON output, rich tables."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from eaglewire.errors import ConfigError, EaglewireError

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_INVALID_INPUT = 2

console = Console()
err_console = Console(stderr=True)

DEVICE_HELP = "cpu | cuda | cuda:N | auto (cuda when available)"


def resolve_device(device: str) -> str:
    """--device as every command spells it: 'auto' -> 'cuda' when CUDA is available, else 'cpu'."""
    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", device):
        raise ConfigError(f"--device: expected {DEVICE_HELP}, got {device!r}")
    if device != "auto":
        return device
    import torch  # here, not at import: --help stays fast

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_app(app: typer.Typer) -> None:
    try:
        app(standalone_mode=False)
    except EaglewireError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(EXIT_INVALID_INPUT)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except SystemExit:
        raise
    except typer.Abort:
        sys.exit(130)
    except Exception as e:
        # Usage errors from typer's (vendored) click: they know how to show themselves.
        show = getattr(e, "show", None)
        if callable(show) and hasattr(e, "exit_code"):
            show()
            sys.exit(EXIT_INVALID_INPUT)
        raise


def run_script(main: Callable[[], int]) -> NoReturn:
    """A benchmark script's entry point: exit with `main`'s status, or, on bad input (an
    EaglewireError), with EXIT_INVALID_INPUT and the error on stderr, as the CLI does."""
    try:
        status = main()
    except EaglewireError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(EXIT_INVALID_INPUT)
    sys.exit(status)


def parse_int_list(text: str | None, *, what: str) -> list[int] | None:
    """'3,31,59' -> [3, 31, 59]; a clear error otherwise."""
    if text is None or text.strip() == "":
        return None
    try:
        return [int(p) for p in text.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated integers like 2,15,27, got {text!r}") from None


def parse_source_repeats(text: str | None) -> tuple[str, ...] | None:
    """--source-repeats 'chitchat:2,humaneval:4' -> ('chitchat:2', 'humaneval:4'), for
    TrainConfig.source_repeats (which checks each entry); None when the flag was not given."""
    return None if text is None else tuple(entry for entry in text.split(",") if entry)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str | None = None
) -> None:
    # no vertical rules: the quickstart's summary of 8 columns still fits an 80-column terminal
    table = Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
    )
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(v) for v in r])
    console.print(table)
