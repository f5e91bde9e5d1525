"""The package layers import only downward (docs/layout.md).

Every ``import`` / ``from ... import`` in ``rlflow/`` is read with ``ast`` (those inside functions,
the lazy ones, included), as are ``importlib.import_module("rlflow...")`` calls with a literal name.
A package may import packages of a lower tier, and in its own tier only the ones listed before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "rlflow"

# Lowest tier first; inside a tier, a package may import the ones listed before it.
TIERS: list[list[str]] = [
    ["errors", "utils", "protocol", "meta_info", "config"],
    ["workers", "models", "data", "rewards", "algos"],
    ["engines", "rollout", "observability"],
    ["roles"],
    ["trainer", "service"],
]
ORDER = {name: index for index, name in enumerate(name for tier in TIERS for name in tier)}
TIER = {name: tier_index for tier_index, tier in enumerate(TIERS) for name in tier}


def _top_package(path: Path) -> str:
    return path.relative_to(PACKAGE_ROOT).parts[0].removesuffix(".py")


def _imported_rlflow_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == "rlflow" or name.startswith("rlflow.")]


def _allowed(source: str, target: str) -> bool:
    if source == target:
        return True
    if TIER[target] < TIER[source]:
        return True
    return TIER[target] == TIER[source] and ORDER[target] < ORDER[source]


def upward_imports() -> list[str]:
    """Every import that goes up (or sideways to a later package of the same tier), as ``file:line -> module``."""
    bad = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if path.parent == PACKAGE_ROOT and path.name == "__init__.py":
            continue
        source = _top_package(path)
        for line, module in _imported_rlflow_modules(ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            if len(parts) < 2:
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports the root package")
                continue
            target = parts[1]
            if target not in ORDER:
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} -> {module} (package not in TIERS)")
            elif not _allowed(source, target):
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} -> {module} ({source} may not import {target})")
    return bad


def test_every_package_is_placed_in_a_tier():
    packages = {_top_package(p) for p in PACKAGE_ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert packages - {"__init__"} == set(ORDER)


def test_no_import_goes_upward():
    assert upward_imports() == []


@pytest.mark.parametrize("lower", ["roles", "engines", "rollout", "algos"])
def test_lower_layers_never_import_the_drivers(lower):
    for path in (PACKAGE_ROOT / lower).rglob("*.py"):
        for line, module in _imported_rlflow_modules(ast.parse(path.read_text())):
            assert not module.startswith("rlflow.trainer"), f"{path}:{line} imports {module}"


def test_the_walker_sees_lazy_and_importlib_imports():
    tree = ast.parse(
        "def f():\n    from rlflow.trainer import x\n"
        "import importlib\nimportlib.import_module('rlflow.roles.actor')\n"
    )
    assert [name for _, name in _imported_rlflow_modules(tree)] == ["rlflow.trainer", "rlflow.roles.actor"]
