"""The floors of the package (README "Architecture"): a module never imports a higher floor, and
the two packages on the inference floor (inference, review) never import each other. Checked on
every import statement, including the ones inside functions. Also: every file the README's
algorithm table names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from protdp.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "protdp"

# floor of each top-level module / subpackage of protdp (README "Architecture")
FLOORS = {
    "__init__": 0, "errors": 0, "config": 0, "resources": 0, "fileio": 0, "metrics": 0,
    "paths": 0, "text": 0,
    "data": 1, "msa": 1.5, "multimer": 1.6, "templates": 1.5,
    "model": 2,
    "parallel": 3,
    "train": 4,
    "gating": 5,
    "workqueue": 5.8,
    "relax": 5.5,
    "inference": 6, "review": 6,
    "workflows": 7,
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


def test_readme_architecture_table_names_real_files():
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    files = set(re.findall(r"`(protdp/[\w/]+\.py)`", section))
    assert len(files) >= 15, "the algorithm table lists the files"
    missing = sorted(f for f in files if not (REPO_ROOT / f).is_file())
    assert not missing, missing
