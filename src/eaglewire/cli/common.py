"""Shared CLI plumbing: error-to-exit-code mapping, JSON output, rich tables."""

from __future__ import annotations

import json
import re
import sys
import traceback
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
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

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
    """Run the CLI with the exit-code contract (README, "Exit codes"): 0 done and clean, 1 a check ran
    and found something, 2 invalid input or a refusal, 130 interrupted, 3 an internal error (a bug).

    Standalone mode, so that the framework itself turns `typer.Exit(n)` into the process status, a
    usage error into 2 and Ctrl-C into 130. Only our own errors are caught here: their message is
    the whole report (expected, actual, fix), so no traceback."""
    try:
        app()
    except EaglewireError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(EXIT_INVALID_INPUT)
    except Exception:  # noqa: BLE001  (reported, not swallowed: exit 3 with the traceback)
        # Not a verdict: exit 1 would read as "a check found something". Keep the traceback for the report.
        traceback.print_exc()
        sys.stderr.write("internal error: this is a bug in eaglewire, not a finding about your inputs\n")
        sys.exit(EXIT_INTERNAL)


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
