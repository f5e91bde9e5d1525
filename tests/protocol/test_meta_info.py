"""The ``meta_info`` schema (``rlflow/meta_info.py``): typed reads, and no bare-string key anywhere in ``rlflow/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlflow import meta_info
from rlflow.meta_info import METRICS, MINI_BATCH_SIZE, SCHEMA, TEMPERATURE, MetaKey

PACKAGE_ROOT = Path(meta_info.__file__).resolve().parent
KEY_METHODS = {"get", "pop", "setdefault"}


def bare_keys(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` of each ``meta_info`` key written as a string literal: ``x.meta_info["k"]``,
    ``x.meta_info.get("k")`` (``pop``, ``setdefault``), ``x.meta_info.update(k=...)`` or ``({"k": ...})``,
    ``x.meta_info = {"k": ...}``, ``DataProto(..., meta_info={"k": ...})`` and ``meta_info_keys=["k"]``."""
    found = []

    def is_meta(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "meta_info"

    def literal_keys(node: ast.AST) -> None:
        if isinstance(node, ast.Dict):
            found.extend((node.lineno, key.value) for key in node.keys if isinstance(key, ast.Constant))
        elif isinstance(node, (ast.List, ast.Tuple)):
            found.extend((node.lineno, item.value) for item in node.elts if isinstance(item, ast.Constant))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and is_meta(node.value) and isinstance(node.slice, ast.Constant):
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_meta(node.func.value):
            if node.func.attr in KEY_METHODS and node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, node.args[0].value))
            if node.func.attr == "update":
                found.extend((node.lineno, kw.arg) for kw in node.keywords if kw.arg)
                for arg in node.args:
                    literal_keys(arg)
        elif isinstance(node, ast.Assign) and any(is_meta(target) for target in node.targets):
            literal_keys(node.value)
        elif isinstance(node, ast.keyword) and node.arg in ("meta_info", "meta_info_keys"):
            literal_keys(node.value)
    return sorted(found)


def test_the_scan_finds_each_bare_form():
    source = (
        'a = d.meta_info["t"]\nd.meta_info.get("g", 0)\nd.meta_info.pop("m")\nd.meta_info.update(v=1)\n'
        'd.meta_info.update({"s": 1})\nd.meta_info = {"x": 1}\nDataProto(meta_info={"y": 1})\n'
        'd.select(meta_info_keys=["z"])\nok = d.meta_info[TEMPERATURE.name]\n'
    )
    assert [key for _, key in bare_keys(source)] == ["t", "g", "m", "v", "s", "x", "y", "z"]


def test_no_module_names_a_meta_info_key_by_a_bare_string():
    bare = [f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} '{key}'"
            for path in sorted(PACKAGE_ROOT.rglob("*.py")) for line, key in bare_keys(path.read_text())]
    assert bare == []


def test_every_key_of_the_schema_is_used_outside_it():
    names = {key.name for key in SCHEMA}
    assert len(names) == len(SCHEMA)
    constants = {name for name, value in vars(meta_info).items() if isinstance(value, MetaKey)}
    assert constants == {name for name in constants if getattr(meta_info, name) in SCHEMA}
    sources = "\n".join(path.read_text() for path in PACKAGE_ROOT.rglob("*.py") if path.name != "meta_info.py")
    assert sorted(name for name in constants if name not in sources) == []


def test_read_converts_defaults_and_names_a_missing_required_key():
    assert TEMPERATURE.read({"temperature": 1}) == 1.0 and isinstance(TEMPERATURE.read({"temperature": 1}), float)
    assert TEMPERATURE.read({}) == 1.0
    with pytest.raises(KeyError, match="meta_info needs 'mini_batch_size'.*it has \\['seed'\\]"):
        MINI_BATCH_SIZE.read({"seed": 1})
    meta = {"metrics": {"a": 1.0}, "seed": 2}
    assert METRICS.pop(meta) == {"a": 1.0} and meta == {"seed": 2}
    assert METRICS.pop(meta) == {} and METRICS.read({}) is not METRICS.default  # a fresh dict each time
