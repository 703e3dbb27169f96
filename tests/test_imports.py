"""No import cycle among recast_cli's modules, counting the imports inside functions.

A function-level import hides a cycle from Python (it runs after both modules have loaded),
not from the reader: every ``import`` and ``from … import`` of a file, at any depth, is an edge
to the deepest recast_cli module it names. An edge from a submodule to its own parent package
is not counted (importing a submodule loads its package first anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

import recast_cli

PACKAGE = Path(recast_cli.__file__).resolve().parent


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _deepest(name: str, known: dict[str, Path]) -> str | None:
    while name not in known:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def import_edges(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The recast_cli modules that ``name`` imports anywhere in its file → the line of the first import."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    edges: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]  # a name imported may be a submodule
        else:
            continue
        for target in targets:
            module = _deepest(target, known)
            if module is None or module == name or name.startswith(module + "."):
                continue
            edges.setdefault(module, node.lineno)
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: import_edges(name, path, known) for name, path in known.items()}


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """One cycle through the component's first module, shortest first (breadth-first search)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w in component and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def describe(graph: dict[str, dict[str, int]], component: set[str]) -> str:
    """The component's modules, then one cycle as ``module:line`` of each import that closes it."""
    cycle = a_cycle(graph, component)
    steps = " → ".join(f"{a}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:]))
    return f"{', '.join(sorted(component))}\n    e.g. {steps} → {cycle[-1]}"


def test_import_graph_sees_imports_inside_functions_and_relative_imports(tmp_path):
    source = tmp_path / "recast_cli" / "evaluate" / "stage.py"
    source.parent.mkdir(parents=True)
    source.write_text("from . import curve\nfrom ..setting.load import load_setting\nimport recast_cli.evaluate\n\n"
                      "def f():\n    from recast_cli.train.config import TrainConfig\n")
    known = {name: tmp_path for name in ("recast_cli", "recast_cli.evaluate", "recast_cli.evaluate.curve",
                                         "recast_cli.setting.load", "recast_cli.train", "recast_cli.train.config")}
    assert import_edges("recast_cli.evaluate.stage", source, known) == {
        "recast_cli.evaluate.curve": 1, "recast_cli.setting.load": 2, "recast_cli.train.config": 6}


def test_cycle_finder_finds_a_cycle_and_names_it():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]
    assert a_cycle(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]


def test_recast_cli_has_no_import_cycle():
    graph = import_graph()
    assert "recast_cli.setting.load" in graph and graph["recast_cli.cli"], "the scan found no modules or no imports"
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles in recast_cli:\n  " + "\n  ".join(describe(graph, c) for c in cycles)
