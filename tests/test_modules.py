"""docs/modules.md against the code: every module has a row, imports only what its row allows,
and only command modules import typer or another module's private names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_imports import PACKAGE, import_graph, modules

DOC = Path(__file__).resolve().parents[1] / "docs" / "modules.md"
COMMAND_MODULES = re.compile(r"^recast_cli(\.[a-z_0-9]+)*\.commands$|^recast_cli\.cli$")


def dotted(name: str) -> str:
    name = name.strip().strip("`")
    return "recast_cli" if name == "recast_cli" else "recast_cli." + name.replace("/", ".")


def doc_rows() -> dict[str, set[str]]:
    """Row name (a module, or ``recast_cli.pkg.*``) → the modules and packages it may import."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        allowed = re.sub(r"\([^)]*\)", "", cells[2])
        targets = set() if allowed.strip() in ("—", "") else {dotted(t) for t in allowed.split(",") if t.strip()}
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[dotted(name)] = targets
    return rows


def row_of(module: str, rows: dict[str, set[str]]) -> str | None:
    """The row that covers a module: its own, its package's ``pkg/*``, or (a package's ``__init__``
    without a row of its own) the package itself, whose modules' imports are checked instead."""
    if module in rows:
        return module
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        wildcard = ".".join(parts[:k]) + ".*"
        if wildcard in rows:
            return wildcard
    return None


def package_of(module: str, known) -> str:
    """The stage or layer package a module belongs to (``recast_cli`` for a top-level module)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or known[module].name == "__init__.py" else "recast_cli"


def test_the_doc_parses_into_rows():
    rows = doc_rows()
    assert len(rows) > 40 and rows["recast_cli.errors"] == set()
    assert rows["recast_cli.solve.stage"] == {"recast_cli.artifacts", "recast_cli.bounds", "recast_cli.errors",
                                              "recast_cli.grid", "recast_cli.kernels"}


def test_every_module_has_a_row_and_every_row_a_module():
    known, rows = modules(), doc_rows()
    missing = sorted(m for m in known if row_of(m, rows) is None and known[m].name != "__init__.py")
    assert not missing, f"modules without a row in docs/modules.md: {missing}"
    stale = sorted(r for r in rows if r not in known and not any(m.startswith(r[:-1]) for m in known))
    assert not stale, f"rows in docs/modules.md naming no module: {stale}"


def test_every_import_is_allowed_by_its_row():
    known, rows, graph = modules(), doc_rows(), import_graph()
    wrong = []
    for module, edges in sorted(graph.items()):
        row = row_of(module, rows)
        allowed = rows[row] if row is not None else set()  # a package's __init__: nothing outside the package
        own = package_of(module, known)
        for target, line in edges.items():
            if own != "recast_cli" and (target == own or target.startswith(own + ".")):
                continue  # the modules of one package may import each other (no cycles: test_imports)
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                wrong.append(f"{module}:{line} imports {target}")
    assert not wrong, "imports docs/modules.md does not allow:\n  " + "\n  ".join(wrong)


def test_only_command_modules_import_typer_and_nobody_imports_private_names():
    typer_users, private = [], []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "typer" for a in node.names):
                typer_users.append(module)
            if isinstance(node, ast.ImportFrom):
                if (node.module or "").split(".")[0] == "typer":
                    typer_users.append(module)
                if (node.module or "").startswith("recast_cli") or node.level:
                    private += [f"{module}: {a.name}" for a in node.names
                                if a.name.startswith("_") and a.name != "__version__"]
    assert sorted(m for m in typer_users if not COMMAND_MODULES.match(m)) == []
    assert private == []


def test_the_cli_package_scan_covers_the_command_modules():
    commands = [m for m in modules() if COMMAND_MODULES.match(m)]
    assert {"recast_cli.cli", "recast_cli.policy.commands", "recast_cli.train.commands"} <= set(commands)
    assert PACKAGE.name == "recast_cli"


def test_every_allowance_is_used():
    """The table is the truth both ways: an allowance no module of its row uses is stale and goes."""
    known, rows, graph = modules(), doc_rows(), import_graph()
    used: dict[str, set[str]] = {row: set() for row in rows}
    for module, edges in graph.items():
        row = row_of(module, rows)
        if row is not None:
            used[row] |= set(edges)
    groups: dict[frozenset[str], set[str]] = {}  # rows written as one (`a`, `b` | ... | allowed): their union
    for row, allowed in rows.items():
        groups.setdefault(frozenset(allowed), set()).add(row)
    stale = []
    for row, allowed in sorted(rows.items()):
        union = set().union(*(used[r] for r in groups[frozenset(allowed)]))
        stale += [f"{row} → {a}" for a in sorted(allowed)
                  if not any(t == a or t.startswith(a + ".") for t in union)]
    assert not stale, "allowances in docs/modules.md that no import uses:\n  " + "\n  ".join(stale)
