"""Declared ranges of numeric config keys, and the check that walks a schema with them.

Every ``int`` / ``float`` field of a config dataclass (optional ones and lists of numbers
included) declares the values it accepts in the class's ``RANGES`` table, ``{field name: Range}``,
next to its fields; a subclass adds its own fields' entries (the tables of the class's bases are
read too). ``range_errors`` walks a config against its schema and gives one line per value out of
its range, naming the full key (``validate_config`` raises the first as a ``ConfigError``);
``undeclared_numeric_fields`` lists the numeric fields without a declared range (a test walks
every schema with it, so a new numeric key cannot skip its range). A null value is not checked: null means "off" or "derived"
wherever a number is optional. Every value must also be finite (no nan, no inf).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Union

_NUMBERS = (int, float)


@dataclass(frozen=True)
class Range:
    """An interval of legal values (``low``/``high`` None: unbounded; ``*_open``: the end itself excluded),
    plus single values legal outside it (``also``: -1 for "off"); ``note`` says what such a value means."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()
    note: str = ""

    def contains(self, value: float) -> bool:
        """Whether ``value`` is finite and in the interval, or one of ``also``."""
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        """The rule in words: ``>= 1``, ``in (0, 1]``, ``-1 or >= 1``, ``a finite number``."""
        if self.low is not None and self.high is not None:
            rule = f"in {'(' if self.low_open else '['}{_fmt(self.low)}, {_fmt(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            rule = f"{'>' if self.low_open else '>='} {_fmt(self.low)}"
        elif self.high is not None:
            rule = f"{'<' if self.high_open else '<='} {_fmt(self.high)}"
        else:
            rule = "a finite number"
        alternatives = " or ".join(_fmt(value) for value in self.also)
        rule = f"{alternatives} or {rule}" if alternatives else rule
        return f"{rule} ({self.note})" if self.note else rule


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# The ranges most keys share.
AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1)
FINITE = Range()
SEED = Range(0, 2**32 - 1)  # numpy's seeds
OFF_OR_AT_LEAST_1 = Range(1, also=(-1,), note="-1: off")

Ranges = Mapping[str, Range]


def declared_range(schema: type, name: str) -> Optional[Range]:
    """The range ``schema`` (or the nearest base class declaring it) gives field ``name``; None if undeclared."""
    for klass in schema.__mro__:
        table = vars(klass).get("RANGES", {})
        if name in table:
            return table[name]
    return None


def _unwrap_optional(kind: Any) -> Any:
    if typing.get_origin(kind) is Union:
        args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


def _number_kind(kind: Any) -> bool:
    """Whether a field of type ``kind`` holds numbers: int, float, an optional one, or a list of them."""
    kind = _unwrap_optional(kind)
    if typing.get_origin(kind) in (list, tuple):
        return all(arg in _NUMBERS or arg is Ellipsis for arg in typing.get_args(kind))
    return kind in _NUMBERS


def _fields(schema: type) -> Iterator[tuple[str, Any]]:
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        yield field.name, hints[field.name]


def undeclared_numeric_fields(schema: type, prefix: str = "") -> list[str]:
    """The dotted keys of numeric fields under ``schema`` (nested dataclasses included) that declare no range."""
    missing = []
    for name, kind in _fields(schema):
        nested = _unwrap_optional(kind)
        if dataclasses.is_dataclass(nested):
            missing += undeclared_numeric_fields(nested, f"{prefix}{name}.")
        elif _number_kind(kind) and declared_range(schema, name) is None:
            missing.append(f"{prefix}{name}")
    return missing


def _get(node: Any, name: str) -> Any:
    """Field ``name`` of a dataclass instance, or key ``name`` of a mapping (dict, DictConfig)."""
    return getattr(node, name, None) if dataclasses.is_dataclass(node) else node.get(name)


def range_errors(node: Any, schema: type, prefix: str = "") -> Iterator[str]:
    """One ``config key '<key>': must be <rule>, got <value>`` message per value of ``node`` out of its range."""
    for name, kind in _fields(schema):
        value = _get(node, name)
        if value is None:
            continue
        nested = _unwrap_optional(kind)
        if dataclasses.is_dataclass(nested):
            yield from range_errors(value, nested, f"{prefix}{name}.")
            continue
        legal = declared_range(schema, name)
        if legal is None or not _number_kind(kind):
            continue
        items = list(value) if typing.get_origin(nested) in (list, tuple) else [value]
        if not all(isinstance(item, _NUMBERS) and not isinstance(item, bool) and legal.contains(item) for item in items):
            yield f"config key '{prefix}{name}': must be {legal.describe()}, got {_shown(value)}"


def _shown(value: Any) -> str:
    return str(list(value)) if not isinstance(value, _NUMBERS) else str(value)

