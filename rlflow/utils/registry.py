"""One registry class for every pluggable piece of rlflow (docs/registries.md lists them all).

A ``Registry`` maps the names that appear in a config to implementations. Every registry is a
module-level ``<THING>_REGISTRY`` and every entry is added the same way, by decorating the
function or class where it is defined::

    @POLICY_LOSS_REGISTRY.register("vanilla")
    def compute_policy_loss_vanilla(...): ...

Callers look an entry up by name, never through an if/else chain, and an unknown name raises one
message in one format, for every registry and for the plain tables of names that config values
are checked against (``unknown_name_message``)::

    unknown <kind> '<name>' (config key <key>); registered: a, b, c

Options a registry opts into: aliases (one object under several names), per-entry metadata,
glob patterns (``patterns=True``: exact name first, then the longest matching pattern),
entries that must subclass a base class (``base=``), a class attribute set to the entry's name
(``name_attribute=``), and lazy discovery (``discovery=``: names that are listed before they are
imported, and imported on first lookup).

What it does not cover:

* unregistering one entry: only ``temporary()`` rolls a whole registry back, for tests;
* versions of an entry, or entry-point (setuptools) discovery of installed packages;
* other processes: a registry lives in one process, so a Ray worker holds what its own imports
  registered, nothing the driver registered at run time;
* thread safety: registration is meant to happen at import time; there is no lock.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import pkgutil
from contextlib import contextmanager
from enum import Enum
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, Protocol, TypeVar

from rlflow.errors import UserError

T = TypeVar("T")
GLOB_CHARS = "*?["


class UnknownNameError(UserError, ValueError):
    """A config value names nothing registered; the message lists what is."""


class Discovery(Protocol):
    """Names that can be registered on demand, and how to register one."""

    def names(self) -> Iterable[str]:
        """Every name this discovery can load, without importing anything."""

    def load(self, name: str) -> None:
        """Import whatever registers ``name``."""


class PackageDiscovery:
    """The modules (``<name>.py``) and subpackages (``<name>/__init__.py``) of one package.

    ``names()`` lists them without importing them; ``load(name)`` imports ``<package>.<name>``.
    Names starting with ``_`` and those in ``exclude`` (infrastructure) are left out.
    """

    def __init__(self, package: str, exclude: Iterable[str] = ()) -> None:
        self.package = package
        self.exclude = frozenset(exclude)

    def names(self) -> list[str]:
        spec = importlib.util.find_spec(self.package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        return sorted(
            info.name
            for info in pkgutil.iter_modules(locations)
            if not info.name.startswith("_") and info.name not in self.exclude
        )

    def load(self, name: str) -> None:
        importlib.import_module(f"{self.package}.{name}")


def as_name(name_or_enum: str | Enum) -> str:
    """The registry key of a plain string or a string Enum member."""
    return name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)


def unknown_name_message(kind: str, name: str, names: Iterable[str], config_key: Optional[str] = None,
                         hint: str = "") -> str:
    """The one message for a ``kind`` name that is not one of ``names`` (a registry's or a table's)."""
    where = f" (config key {config_key})" if config_key else ""
    listed = ", ".join(sorted(names)) or "(none)"
    return f"unknown {kind} {name!r}{where}; registered: {listed}" + (f"; {hint}" if hint else "")


class Registry(Generic[T]):
    """Maps config names to implementations; ``kind`` and ``config_key`` name them in messages.

    ``error`` is the exception class an unknown name raises (a ``UserError``, so the CLI prints
    one line); ``hint`` is appended to that message (say how to add an entry). With
    ``name_attribute``, registering a class sets that attribute to its first name (a dataset
    converter knows it is ``gsm8k``). ``check`` runs on every object before it is registered and raises to
    refuse it (a reward function that cannot take the four arguments every reward gets).
    """

    def __init__(
        self,
        kind: str,
        config_key: Optional[str] = None,
        *,
        error: type[Exception] = UnknownNameError,
        hint: str = "",
        base: Optional[type] = None,
        patterns: bool = False,
        name_attribute: Optional[str] = None,
        discovery: Optional[Discovery] = None,
        check: Optional[Callable[[T], Any]] = None,
    ) -> None:
        self.kind = kind
        self.config_key = config_key
        self.error = error
        self.hint = hint
        self.base = base
        self.patterns = patterns
        self.name_attribute = name_attribute
        self.discovery = discovery
        self.check = check
        self._entries: dict[str, T] = {}
        self._metadata: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ registering
    def register(self, *names: str | Enum, override: bool = False, **metadata: Any) -> Callable[[T], T]:
        """Decorator registering an object under one or more names (aliases share it and its metadata).

        A name taken by another object raises ``ValueError`` unless ``override=True``;
        registering the same object again (or one with the same qualified name: a module
        imported twice) is allowed.
        """
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")

        def decorator(obj: T) -> T:
            for name in names:
                self._check(as_name(name), obj, override)
            for name in names:
                self._entries[as_name(name)] = obj
                self._metadata[as_name(name)] = dict(metadata)
            if self.name_attribute is not None:
                setattr(obj, self.name_attribute, as_name(names[0]))
            return obj

        return decorator

    def _check(self, name: str, obj: T, override: bool) -> None:
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(f"{self.kind} {name!r} must be a subclass of {self.base.__name__}; got {obj!r}")
        if self.check is not None:
            self.check(obj)
        existing = self._entries.get(name)
        if existing is None or override or existing is obj or _qualname(existing) == _qualname(obj):
            return
        raise ValueError(
            f"{self.kind} {name!r} is already registered to {_qualname(existing)}; "
            f"pick another name for {_qualname(obj)} or pass override=True to replace it"
        )

    # ------------------------------------------------------------------ looking up
    def get(self, name: str | Enum, config_key: Optional[str] = None) -> T:
        """The object registered under ``name``; an unknown name raises ``self.error`` listing the names.

        ``config_key`` names the key the value came from when it is not the registry's default
        one (an engine mounted at ``critic.engine``), so the message points at the right key.
        """
        return self._entries[self._resolve(as_name(name), config_key)]

    def metadata(self, name: str | Enum) -> dict[str, Any]:
        """The keyword arguments ``name`` was registered with (a copy)."""
        return dict(self._metadata[self._resolve(as_name(name))])

    def names(self) -> list[str]:
        """Registered names and patterns, plus discoverable names not imported yet, sorted."""
        discovered = self.discovery.names() if self.discovery is not None else ()
        return sorted(set(self._entries) | set(discovered))

    def unknown_message(self, name: str, config_key: Optional[str] = None) -> str:
        """The one message for a name that is not registered."""
        return unknown_name_message(self.kind, name, self.names(), config_key or self.config_key, self.hint)

    def _resolve(self, name: str, config_key: Optional[str] = None) -> str:
        """The entry key that serves ``name``: the exact name (imported on demand), else the longest pattern."""
        if name not in self._entries and self.discovery is not None and name in self.discovery.names():
            self.discovery.load(name)
            if name not in self._entries:
                raise self.error(f"importing {self.kind} {name!r} registered nothing under that name")
        if name in self._entries:
            return name
        pattern = self._longest_pattern(name)
        if pattern is None:
            raise self.error(self.unknown_message(name, config_key))
        return pattern

    def _longest_pattern(self, name: str) -> Optional[str]:
        if not self.patterns:
            return None
        matches = [key for key in self._entries if any(c in key for c in GLOB_CHARS) and fnmatch.fnmatchcase(name, key)]
        return max(matches, key=len, default=None)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, (str, Enum)):
            return False
        key = as_name(name)
        return key in self.names() or self._longest_pattern(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    # ------------------------------------------------------------------ tests
    @contextmanager
    def temporary(self) -> Iterator["Registry[T]"]:
        """Entries registered inside the ``with`` block are dropped on exit (for tests).

        Entries that discovery imported inside the block stay: their modules stay imported.
        """
        saved_entries, saved_metadata = dict(self._entries), dict(self._metadata)
        try:
            yield self
        finally:
            discovered = set(self.discovery.names()) if self.discovery is not None else set()
            kept = (set(self._entries) - set(saved_entries)) & discovered
            saved_entries.update({name: self._entries[name] for name in kept})
            saved_metadata.update({name: self._metadata[name] for name in kept})
            self._entries, self._metadata = saved_entries, saved_metadata


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
