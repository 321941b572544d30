"""No import cycle between eaglewire's packages, nor between its modules.

Every module under src/eaglewire is parsed (nothing is imported) and every `import` / `from ... import`
in it counts, wherever it sits: at module level, inside a function (a lazy import keeps the cost of
loading a module down, but it still makes the importer depend on the imported, and one used to hide a
cycle is still a cycle), and under `if TYPE_CHECKING:` (an annotation is a dependency too; moving the
shared type into a leaf module is the fix, not hiding the import from the interpreter).
`from a.b import c` depends on the module `a.b.c` when there is one, else on `a.b`; importing a module
is not taken to depend on its parent packages' `__init__`.

A package is the first component under eaglewire (`eaglewire.bench.harness` -> bench; a top-level
module such as `eaglewire.errors` is its own). A cycle is named with the import line of each step.
"""

from __future__ import annotations

import ast
from collections import defaultdict, deque
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import eaglewire

SRC = Path(eaglewire.__file__).parent

# Imports left out of the graphs (known cycles being removed); empty: every cycle counts.
ALLOWED_PACKAGE_EDGES: set[tuple[str, str]] = set()  # none: a new package cycle is a defect
ALLOWED_MODULE_CYCLES: set[frozenset[str]] = set()  # none: a new module cycle is a defect


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, e.g. eaglewire.bench.harness
    imported: str  # the module it depends on
    path: Path  # the importer's file
    line: int
    text: str  # the import statement as written

    def describe(self, root: Path) -> str:
        return f"{self.path.relative_to(root.parent)}:{self.line}: {self.text}"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package rooted at `root` (a directory holding __init__.py) -> its file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module name `node` imports from (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` lives in: itself, or the nearest enclosing module (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@cache
def imports(root: Path) -> tuple[Import, ...]:
    """Every import between modules of `root`'s package, at any depth of the syntax tree."""
    modules = module_names(root)
    out = []
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node, path.name == "__init__.py")
                # `from a.b import c`: the module a.b.c when there is one, else a.b itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            text = ast.unparse(node)
            for target in dict.fromkeys(targets):
                imported = _owner(target, modules)
                if imported is not None and imported != module:
                    out.append(Import(module, imported, path, node.lineno, text))
    return tuple(out)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def graph_of(edges: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    return graph


def shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node: [a, b, ..., a] (breadth first)."""
    start = min(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & component):
            if child == start:
                path = [node]  # back from the last step to the start
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child not in parent:
                parent[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def cycle_report(
    kind: str,
    component: set[str],
    graph: dict[str, set[str]],
    witnesses: dict[tuple[str, str], list[Import]],
    root: Path,
) -> str:
    """A shortest cycle of `component` ([a, b, ..., a]) with the import lines that make each step."""
    cycle = shortest_cycle(graph, component)
    lines = [f"{kind} cycle: {' -> '.join(cycle)}"]
    if len(component) > len(cycle) - 1:
        knot = ", ".join(sorted(component))
        lines.append(f"  (one of the cycles among {len(component)} that all reach each other: {knot})")
    for a, b in zip(cycle, cycle[1:], strict=False):
        lines.append(f"  {a} -> {b}:")
        lines += [f"    {w.describe(root)}" for w in witnesses[(a, b)]]
    return "\n".join(lines)


def package_cycles(root: Path, allowed: AbstractSet[tuple[str, str]] = frozenset()) -> list[str]:
    """One report per cycle between packages, leaving out the imports in `allowed` (importer, imported)."""
    witnesses: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports(root):
        a, b = package_of(imp.importer), package_of(imp.imported)
        if a != b and (imp.importer, imp.imported) not in allowed:
            witnesses[(a, b)].append(imp)
    graph = graph_of(witnesses)
    return [cycle_report("package", c, graph, witnesses, root) for c in components(graph)]


def module_cycles(root: Path, allowed: AbstractSet[frozenset[str]] = frozenset()) -> list[str]:
    """One report per cycle between modules, but for the cycles whose modules are exactly an `allowed` set."""
    witnesses: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports(root):
        witnesses[(imp.importer, imp.imported)].append(imp)
    graph = graph_of(witnesses)
    return [
        cycle_report("module", c, graph, witnesses, root)
        for c in components(graph)
        if frozenset(c) not in allowed
    ]


def test_no_cycle_between_packages() -> None:
    cycles = package_cycles(SRC, ALLOWED_PACKAGE_EDGES)
    assert not cycles, (
        "eaglewire's packages import each other in a cycle; move the shared piece into the package both "
        "depend on, or turn the dependency around:\n" + "\n".join(cycles)
    )


def test_no_cycle_between_modules() -> None:
    cycles = module_cycles(SRC, ALLOWED_MODULE_CYCLES)
    assert not cycles, (
        "modules import each other in a cycle (function-level and TYPE_CHECKING imports count); move the "
        "shared types into a leaf module both import:\n" + "\n".join(cycles)
    )


def test_every_allowed_cycle_still_exists() -> None:
    """An entry whose cycle is gone (its branch merged) is removed from the lists above."""
    edges = {(imp.importer, imp.imported) for imp in imports(SRC)}
    assert not ALLOWED_PACKAGE_EDGES - edges, f"no longer imported: {sorted(ALLOWED_PACKAGE_EDGES - edges)}"
    present = {frozenset(c) for c in components(graph_of(edges))}
    assert not ALLOWED_MODULE_CYCLES - present, f"cycles gone: {ALLOWED_MODULE_CYCLES - present}"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_lazy_and_type_checking_imports_make_a_cycle(tmp_path: Path) -> None:
    """The checker itself: a cycle closed by a function-level import and one closed under TYPE_CHECKING
    (through a relative import) are both found, each step named with its file, line and statement."""
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/x.py": "from pkg.b import y\n",
            "pkg/b/__init__.py": "",
            "pkg/b/y.py": "def f():\n    from pkg.a.x import g\n    return g\n",
            "pkg/c/__init__.py": "",
            "pkg/c/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import n\n",
            "pkg/c/n.py": "import pkg.c.m\n",
        },
    )
    (packages,) = package_cycles(root)
    assert "package cycle: a -> b -> a" in packages
    assert "pkg/a/x.py:1: from pkg.b import y" in packages
    assert "pkg/b/y.py:2: from pkg.a.x import g" in packages
    modules = module_cycles(root)
    assert len(modules) == 2 and any("pkg/c/m.py:3: from . import n" in m for m in modules), modules
    assert package_cycles(root, {("pkg.b.y", "pkg.a.x")}) == []
    assert len(module_cycles(root, {frozenset({"pkg.c.m", "pkg.c.n"})})) == 1


def test_an_import_of_a_name_depends_on_its_module(tmp_path: Path) -> None:
    """`from pkg.b import thing` (a name, not a module) depends on pkg.b's __init__, not on its siblings."""
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b/__init__.py": "thing = 1\n",
            "pkg/b/c.py": "import pkg.a\n",
        },
    )
    assert {(i.importer, i.imported) for i in imports(root)} == {("pkg.a", "pkg.b"), ("pkg.b.c", "pkg.a")}
    assert module_cycles(root) == []
