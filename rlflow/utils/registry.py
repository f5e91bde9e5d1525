"""A small name -> function registry shared by every pluggable piece of ``core_algos``.

Advantage estimators, policy losses, KL estimators, loss-aggregation modes and KL
controllers each live in one ``Registry``. Adding a variant is one decorated function;
callers look it up by the name that appears in the config, never through an if/else chain.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Generic, Iterator, TypeVar

FnT = TypeVar("FnT", bound=Callable)


def as_name(name_or_enum: str | Enum) -> str:
    """The registry key of a plain string or a string Enum member."""
    return name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)


class Registry(Generic[FnT]):
    """Maps config names to implementations; ``kind`` names the family in error messages."""

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, FnT] = {}

    def register(self, *names: str | Enum) -> Callable[[FnT], FnT]:
        """Decorator registering a function under one or more names (aliases share one function).

        Registering a different function under a taken name raises ``ValueError``;
        re-registering the same function (a module reloaded) is allowed.
        """
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")

        def decorator(fn: FnT) -> FnT:
            for raw in names:
                name = as_name(raw)
                existing = self._entries.get(name)
                if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
                    raise ValueError(
                        f"{self.kind} {name!r} is already registered to {_qualname(existing)}; "
                        f"pick another name for {_qualname(fn)}"
                    )
                self._entries[name] = fn
            return fn

        return decorator

    def get(self, name_or_enum: str | Enum) -> FnT:
        """The implementation registered under ``name``; a ``ValueError`` lists the valid names."""
        name = as_name(name_or_enum)
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r} (config key {self.config_key}); valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, (str, Enum)) and as_name(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
