"""The folders stand on floors: nothing in ``schemas/``, ``resources/``, ``pipelines/``, ``explain/`` or ``assets/`` imports ``replica_lens``.

``replica_lens/`` (the command line, the simulator, the Dagster definitions) stands on
every other folder; an import back up from a lower floor would make the pipeline depend on
the tools that drive it. Read from the source (AST), so lazy imports inside functions count
too, and no module is imported to check.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER_FLOORS = ("schemas", "resources", "pipelines", "explain", "assets")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


@pytest.mark.parametrize("folder", LOWER_FLOORS)
def test_no_module_below_replica_lens_imports_it(folder):
    modules = sorted((ROOT / folder).rglob("*.py"))
    assert modules, folder
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in _imported_modules(path)
        if name == "replica_lens" or name.startswith("replica_lens.")
    ]
    assert not upward, upward


def test_the_snapshot_id_rule_has_one_home():
    """``resources/snapshots.py`` holds the pattern; no other module compiles its own copy."""
    pattern = "[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
    holders = [
        str(path.relative_to(ROOT))
        for folder in (*LOWER_FLOORS, "replica_lens")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if pattern in path.read_text()
    ]
    assert holders == ["resources/snapshots.py"], holders
