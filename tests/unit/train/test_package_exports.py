"""`eaglewire.train` re-exports its entry points lazily: each name resolves, and importing the config
alone (what the quickstart presets and benchmarks/h200/gates.py do) imports no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import eaglewire.train as train_pkg


@pytest.mark.parametrize("name", train_pkg.__all__)
def test_every_exported_name_resolves_to_its_module(name: str) -> None:
    obj = getattr(train_pkg, name)
    assert obj.__module__.startswith("eaglewire.train."), (name, obj.__module__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = train_pkg.no_such_name


def test_importing_the_config_or_the_presets_imports_no_torch() -> None:
    code = "import sys, eaglewire.train.config, eaglewire.recipes.presets; sys.exit('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "importing eaglewire.train.config pulled in torch: " + done.stderr[-2000:]


def test_the_three_name_lists_agree() -> None:
    # __all__ (what `from eaglewire.train import *` and the parametrised test above see), _HOME (where
    # __getattr__ finds each name) and the TYPE_CHECKING imports (what mypy sees) list the same names.
    import ast
    from pathlib import Path

    tree = ast.parse(Path(train_pkg.__file__).read_text(encoding="utf-8"))
    typed = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for imp in node.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    }
    assert set(train_pkg.__all__) == set(train_pkg._HOME) == typed
    assert len(train_pkg.__all__) == len(set(train_pkg.__all__))
