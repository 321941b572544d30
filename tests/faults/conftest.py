"""Start the fault cases in the background as soon as the suite is collected (see background.py),
and run the fault tests last, when their outcomes are (mostly) in."""

from __future__ import annotations

import pytest

from tests.faults import background
from tests.faults.harness import Case


def _is_fault_item(item: pytest.Item) -> bool:
    return item.nodeid.startswith("tests/faults/")


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    items.sort(key=_is_fault_item)  # stable: the rest keep their order, the fault tests go last


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    cases = [
        item.callspec.params["case"]
        for item in session.items
        if getattr(item, "callspec", None) is not None and isinstance(item.callspec.params.get("case"), Case)
    ]
    needs_base = any(_is_fault_item(i) for i in session.items)
    if cases or needs_base:
        background.start(cases)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    background.close_all()
