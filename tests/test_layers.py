"""The package layers import only downward (docs/layout.md), and no module imports itself through others.

Every ``import`` / ``from ... import`` in ``rlflow/`` is read with ``ast`` (those inside functions,
the lazy ones, included), as are ``importlib.import_module("rlflow...")`` calls with a literal name.
A package may import packages of a lower tier, and in its own tier only the ones listed before it;
the packages of a ``frozenset`` tier import none of each other (the drivers and the service share
nothing but lower tiers). A package is a top-level one (``rlflow/<name>``) or a dotted subpackage
named in ``TIERS`` (``config.loading``), which is then a layer of its own. Inside
``rlflow/engines/common`` the rooms follow the same rule (``ENGINE_ROOMS``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable, Union

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "rlflow"

# Lowest tier first; inside a list tier, a package may import the ones listed before it.
Tier = Union[list, frozenset]
TIERS: list[Tier] = [
    ["errors", "utils", "protocol", "meta_info", "config"],
    ["workers", "models", "data", "rewards", "algos"],
    ["engines", "rollout", "observability"],
    ["roles"],
    ["config.loading"],
    frozenset({"trainer", "service"}),
]
ORDER = {name: index for index, name in enumerate(name for tier in TIERS
                                                   for name in (sorted(tier) if isinstance(tier, frozenset) else tier))}
# rlflow/engines/common, lowest first (docs/layout.md, "Inside engines"): each room imports only rooms before it
ENGINE_ROOMS = ["distributed", "optim", "batching", "forward", "checkpoint", "bases", "fsdp"]
ENGINE_BASES = ("delegating_engine", "module_engine")
TIER = {name: tier_index for tier_index, tier in enumerate(TIERS) for name in tier}
SIBLINGS_ONLY_BELOW = {name for tier in TIERS if isinstance(tier, frozenset) for name in tier}


def package_of(dotted: str) -> str:
    """The layer of a dotted module path below ``rlflow`` (``config.loading.choices`` -> ``config.loading``)."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        if ".".join(parts[:length]) in ORDER:
            return ".".join(parts[:length])
    return parts[0]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_package(path: Path) -> str:
    return package_of(_module_name(path)) if _module_name(path) else "__init__"


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
    if source in SIBLINGS_ONLY_BELOW:
        return False
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
            target = package_of(".".join(parts[1:]))
            if target not in ORDER:
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} -> {module} (package not in TIERS)")
            elif not _allowed(source, target):
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} -> {module} ({source} may not import {target})")
    return bad


def test_every_package_is_placed_in_a_tier():
    packages = {_top_package(p) for p in PACKAGE_ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    subpackages = {name for name in ORDER if "." in name}
    assert packages - {"__init__"} == set(ORDER) - subpackages
    assert all((PACKAGE_ROOT / name.replace(".", "/") / "__init__.py").is_file() for name in subpackages)


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


def test_the_drivers_and_the_service_share_only_lower_tiers():
    assert not _allowed("service", "trainer") and not _allowed("trainer", "service")
    assert _allowed("service", "config.loading") and _allowed("trainer", "config.loading")
    assert not _allowed("config.loading", "trainer") and not _allowed("roles", "config.loading")


# ---------------------------------------------------------------------------------------------------------
# Import circles between modules. Lazy (function-level) imports count like any other, so no lazy import
# can hide a circle: a module that needs one to break a circle fails here.
def _module_paths() -> dict[str, Path]:
    return {f"rlflow.{_module_name(path)}".rstrip("."): path for path in PACKAGE_ROOT.rglob("*.py")}


def _resolve(name: str, modules: Iterable[str]) -> str | None:
    known = set(modules)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the rlflow modules it imports (``sources`` maps module names to their code).

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. A module's
    import of a package that contains it is left out (Python initialises a parent package first).
    """
    graph: dict[str, set[str]] = {module: set() for module in sources}
    for module, code in sources.items():
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                target = _resolve(name, sources) if name.startswith("rlflow") else None
                if target and target != module and not module.startswith(f"{target}."):
                    graph[module].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circle_even_through_lazy_imports():
    sources = {module: path.read_text() for module, path in _module_paths().items()}
    assert import_circles(import_graph(sources)) == []


def test_the_circle_finder_sees_a_circle_closed_by_a_lazy_import():
    sources = {
        "rlflow.a": "from rlflow.b import f\n",
        "rlflow.b": "def f():\n    from rlflow.c import g\n",
        "rlflow.c": "import rlflow.a\n",
        "rlflow.d": "from rlflow import a\n",
    }
    assert import_circles(import_graph(sources)) == [["rlflow.a", "rlflow.b", "rlflow.c"]]


def _engine_room(parts: tuple[str, ...]) -> str:
    """The room of a module of rlflow/engines/common, from its path parts below ``common``."""
    name = parts[0].removesuffix(".py")
    return "bases" if name in ENGINE_BASES else name


def test_engine_rooms_import_only_earlier_rooms():
    common = PACKAGE_ROOT / "engines" / "common"
    modules = [p for p in common.iterdir() if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())]
    assert {_engine_room(p.relative_to(common).parts) for p in modules} == set(ENGINE_ROOMS)
    bad = []
    for path in sorted(common.rglob("*.py")):
        source = _engine_room(path.relative_to(common).parts)
        if source == "__init__.py":
            continue
        for line, module in _imported_rlflow_modules(ast.parse(path.read_text())):
            parts = tuple(module.split("."))
            if parts[:3] != ("rlflow", "engines", "common") or len(parts) < 4:
                continue
            target = _engine_room(parts[3:])
            if ENGINE_ROOMS.index(target) > ENGINE_ROOMS.index(source):
                bad.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} -> {module} ({source} may not import {target})")
    assert bad == []
