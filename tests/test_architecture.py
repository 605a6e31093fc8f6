"""The floors of the package (docs/architecture.md): a module never imports a higher floor, and
the two packages on the inference floor (inference, review) never import each other. Checked on
every import statement, including the ones inside functions. Also: every file the algorithm
table of docs/architecture.md names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from protdp.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "protdp"

# floor of each top-level module / subpackage of protdp (docs/architecture.md)
FLOORS = {
    "__init__": 0, "errors": 0, "config": 0, "resources": 0, "fileio": 0, "metrics": 0,
    "paths": 0, "text": 0, "sqlengine": 0,
    "data": 1, "msa": 1.5, "complex": 1.6, "templates": 1.5, "interface": 1.7,
    "model": 2,
    "parallel": 3,
    "train": 4,
    "gating": 5,
    "workqueue": 5.8,
    "relax": 5.5,
    "inference": 6, "review": 6,
    "workflows": 7, "external": 7.5,
    "safety": 8, "planning": 8, "weights": 8,
}
CLI_FLOOR = 9            # protdp/cli.py and every */cli.py: entry points wire anything


def unit_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def floor_of_file(path: Path) -> float:
    if path.name == "cli.py":
        return CLI_FLOOR
    return FLOORS[unit_of(path)]


def imported_units(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level protdp unit) of every protdp import in a module."""
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "protdp":     # `from protdp import data` or `... import __version__`
                names = [a.name if a.name in FLOORS or a.name == "cli" else "__init__"
                         for a in node.names]
            elif node.module.startswith("protdp."):
                names = [node.module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names
                     if a.name.startswith("protdp.") and a.name.count(".") >= 1]
        out += [(node.lineno, n) for n in names]
    return out


def test_every_unit_has_a_floor():
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")}
    assert units <= set(FLOORS) | {"cli", "configs"}, sorted(units - set(FLOORS))


def test_no_upward_or_sideways_imports():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "cli.py":
            continue
        mine, unit = floor_of_file(path), unit_of(path)
        for line, target in imported_units(ast.parse(path.read_text(), str(path))):
            if target in ("cli",) or target not in FLOORS:
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line} imports protdp.{target}")
                continue
            theirs = FLOORS[target]
            if theirs > mine or (theirs == mine and target != unit and mine > 0):
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line}: {unit} (floor {mine}) "
                                f"imports {target} (floor {theirs})")
    assert not problems, "\n".join(problems)


def test_architecture_table_names_real_files():
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Floors", 1)[1].split("\n## Naming", 1)[0]
    files = set(re.findall(r"`(protdp/[\w/]+\.py)`", section))
    assert len(files) >= 15, "the algorithm table lists the files"
    missing = sorted(f for f in files if not (REPO_ROOT / f).is_file())
    assert not missing, missing


# ---- import circles and long functions (issue 48) in protdp/, pipelines/, benchmarks/ ----

CHECKED_TREES = ("protdp", "pipelines", "benchmarks")
MAX_FUNCTION_LINES = 80


def _python_files() -> list[Path]:
    return sorted(p for tree in CHECKED_TREES for p in (REPO_ROOT / tree).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that `name` (a dotted import target) is or lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> modules of the checked trees it imports (every import statement, lazy ones
    included; `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`;
    a package's own `__init__` is not counted as imported by its submodules' imports)."""
    files = {module_name(p): p for p in _python_files()}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                hit = _resolve(target, modules)
                if hit and hit != name:
                    edges.add(hit)
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def test_no_import_circles():
    """No two modules of protdp/, pipelines/, benchmarks/ import each other, directly or
    through others (imports inside functions count: a circle hidden in a lazy import is
    still a circle of responsibilities)."""
    circles = import_circles(import_graph())
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def long_functions() -> list[str]:
    """Every function (def / async def, methods and nested ones included) longer than
    MAX_FUNCTION_LINES, measured as `end_lineno - lineno + 1` of the def node (decorators not
    counted; its docstring, comments and blank lines inside are)."""
    out = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} {lines}")
    return out


def test_no_function_over_80_lines():
    long = long_functions()
    assert not long, "\n".join(long)
