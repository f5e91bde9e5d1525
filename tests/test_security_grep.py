"""No rlflow module unpickles a file unsafely: every load goes through weights_only or an explicit opt-in.

Walks the ``ast`` of every module under ``rlflow/`` for calls that unpickle (``pickle.load(s)``,
``torch.load``, ``np.load(allow_pickle=True)``, ``cloudpickle``/``dill`` loads) and for any
``weights_only=False``. The few allowed sites are listed with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlflow"

# (file relative to rlflow/, enclosing function) -> why this unpickling is allowed.
ALLOWED = {
    ("utils/safe_io.py", "decode_values"): "restores a pickled column only after the caller passed allow_pickle=True",
}
_UNPICKLERS = {("pickle", "load"), ("pickle", "loads"), ("cloudpickle", "load"), ("cloudpickle", "loads"),
               ("dill", "load"), ("dill", "loads"), ("torch", "load"), ("np", "load"), ("numpy", "load")}


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def _dotted(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Attribute):
        base = node.value
        while isinstance(base, ast.Attribute):  # ray.cloudpickle.loads -> cloudpickle
            if (base.attr, node.attr) in _UNPICKLERS:
                return base.attr, node.attr
            base = base.value
        if isinstance(base, ast.Name):
            return base.id, node.attr
    return None


def unsafe_loads(source: str, rel: str) -> list[str]:
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                problem = _problem(child)
                if problem and (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{child.lineno} in {name}(): {problem}")
            visit(child, name)

    visit(ast.parse(source), "<module>")
    return found


def _problem(call: ast.Call) -> str | None:
    if _keyword(call, "weights_only") is False:
        return "weights_only=False"
    target = _dotted(call.func)
    if target not in _UNPICKLERS:
        bare_load = isinstance(call.func, ast.Name) and call.func.id in ("load", "loads")  # from pickle import loads
        if bare_load or (isinstance(call.func, ast.Attribute) and call.func.attr == "Unpickler"):
            return f"bare {ast.unparse(call.func)}()"
        return None
    module, _ = target
    if module == "torch":
        return None if _keyword(call, "weights_only") is True else "torch.load without weights_only=True"
    if module in ("np", "numpy"):
        return "np.load(allow_pickle=True)" if _keyword(call, "allow_pickle") is True else None
    return f"{module}.{call.func.attr}()"


def test_the_checker_catches_each_unsafe_form():
    bad = """
import pickle, torch, numpy as np
from pickle import loads
def f(p):
    pickle.load(open(p, "rb")); pickle.loads(b""); torch.load(p); torch.load(p, weights_only=False)
    np.load(p, allow_pickle=True); loads(b""); pickle.Unpickler(open(p, "rb")).load(); ray.cloudpickle.loads(b"")
def g(p):
    torch.load(p, weights_only=True); np.load(p); pickle.dumps(1)
"""
    found = unsafe_loads(bad, "x.py")
    assert len(found) == 8 and all(" in f()" in line for line in found), found


def test_rlflow_never_unpickles_outside_the_allowed_sites():
    found = [line for path in sorted(ROOT.rglob("*.py")) for line in unsafe_loads(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "unsafe unpickling in rlflow/:\n" + "\n".join(found)


def test_allowed_sites_still_exist():
    for rel, function in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in ast.walk(tree)), (rel, function)
