"""Checks on single dataset rows; every failure is a ``DataError`` naming file, row and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.errors import DataError

# Types a ground truth may have: a value, or a list of acceptable values.
_SCALAR_TYPES = (str, int, float)


def row_error(path: Path, index: int, field: str, problem: str) -> DataError:
    """The one error format for a bad row: ``data file F, row N, field 'x': problem``."""
    return DataError(f"data file {path}, row {index}, field {field!r}: {problem}")


def field_value(row: dict[str, Any], key: str) -> Any:
    """``row[key]``; for a dotted key that is not a column itself, the nested value (``extra_info.question`` is
    ``row['extra_info']['question']``: verl's ``prompt_dict_keys``); None where a step is missing."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def describe(value: Any) -> str:
    """A short description of a bad value for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


def check_messages(messages: Any, path: Path, index: int, field: str) -> list[dict[str, str]]:
    """A non-empty list of ``{role, content}`` string messages, returned as plain dicts."""
    if messages is None:
        raise row_error(path, index, field, "missing")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise row_error(path, index, field, f"must be a non-empty list of {{role, content}} messages, got {describe(messages)}")
    checked = []
    for position, message in enumerate(messages):
        where = f"{field}[{position}]"
        if not isinstance(message, dict):
            raise row_error(path, index, where, f"must be a {{role, content}} dict, got {describe(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise row_error(path, index, f"{where}.{key}", f"must be a string, got {describe(message.get(key))}")
        if not message["role"]:
            raise row_error(path, index, f"{where}.role", "is empty")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def check_ground_truth(value: Any, path: Path, index: int, field: str) -> Any:
    """A string/number ground truth, or a non-empty list of them."""
    if value is None:
        raise row_error(path, index, field, "missing")
    if isinstance(value, bool):
        raise row_error(path, index, field, f"must be a string, number or list of them, got {describe(value)}")
    if isinstance(value, _SCALAR_TYPES):
        return value
    if isinstance(value, (list, tuple)) and value and all(
        isinstance(v, _SCALAR_TYPES) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    raise row_error(path, index, field, f"must be a string, number or list of them, got {describe(value)}")


def check_string(value: Any, path: Path, index: int, field: str) -> str:
    """A non-empty string."""
    if value is None:
        raise row_error(path, index, field, "missing")
    if not isinstance(value, str) or not value:
        raise row_error(path, index, field, f"must be a non-empty string, got {describe(value)}")
    return value


def check_optional_dict(value: Any, path: Path, index: int, field: str) -> dict[str, Any]:
    """A dict, or ``{}`` when absent."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise row_error(path, index, field, f"must be a dict (or absent), got {describe(value)}")
    return dict(value)
