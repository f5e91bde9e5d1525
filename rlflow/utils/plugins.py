"""User plugins: modules and ``.py`` files that every rlflow process imports before it builds anything.

A plugin registers things by being imported (``@ENGINE_REGISTRY.register(...)``,
``@POLICY_LOSS_REGISTRY.register(...)``, ``@REWARD_REGISTRY.register(...)``, ...). The driver imports the plugins named by
``trainer.plugins`` before it validates its config; Ray worker hosts, ``torchrun`` ranks and
reward worker processes import the same list before they build a role or unpickle a task.

A plugin is a dotted module name (``my_pkg.rl_plugin``, importable in every process) or a
path to a ``.py`` file. A file is imported under a module name derived from its absolute path
(``load_module_file``), so importing it twice is a no-op, and classes and functions defined in
it pickle by reference: every process that imported the file resolves them to its own copy.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable

from rlflow.errors import UserError

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_LOADED: list[str] = []


class PluginError(UserError, ImportError):
    """A plugin named in ``trainer.plugins`` cannot be found or fails to import."""


def file_module_name(path: Path) -> str:
    """The module name a ``.py`` file is imported under: its stem plus a hash of its absolute path."""
    path = Path(path).expanduser().resolve()
    stem = re.sub(r"\W", "_", path.stem)
    return f"rlflow_file_{stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"


def load_module_file(path: Path) -> ModuleType:
    """Import ``path`` under ``file_module_name(path)`` (once per process); the module's own exception propagates."""
    path = Path(path).expanduser().resolve()
    name = file_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def normalize_plugin(spec: str) -> str:
    """A module name as given, a ``.py`` path made absolute (against the current directory)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"trainer.plugins: {spec!r} is not a module name or a path to a .py file")
    spec = spec.strip()
    if spec.endswith(".py"):
        return str(Path(spec).expanduser().resolve())
    if not _MODULE_NAME.fullmatch(spec):
        raise PluginError(
            f"trainer.plugins: {spec!r} is neither a dotted module name (my_pkg.plugin) nor a path ending in .py"
        )
    return spec


def import_plugin(spec: str) -> str:
    """Import one plugin (a no-op if this process already did); returns its normalized spec."""
    spec = normalize_plugin(spec)
    if spec.endswith(".py") and not Path(spec).is_file():
        raise PluginError(f"plugin {spec}: no such file (trainer.plugins; a relative path is taken from the current directory)")
    try:
        if spec.endswith(".py"):
            load_module_file(Path(spec))
        else:
            importlib.import_module(spec)
    except BaseException as error:  # noqa: BLE001 - whatever the user's module raises (sys.exit too): name the plugin
        cause = " ".join(f"{type(error).__name__}: {error}".split())
        raise PluginError(f"plugin {spec} failed to import: {cause} (check trainer.plugins)") from None
    if spec not in _LOADED:
        _LOADED.append(spec)
    return spec


def import_plugins(specs: Iterable[str]) -> list[str]:
    """Import each plugin in order and record it for ``loaded_plugins``; returns the normalized specs."""
    return list(dict.fromkeys(import_plugin(spec) for spec in specs))


def loaded_plugins() -> list[str]:
    """The plugins this process imported, in import order (what it hands to the processes it starts)."""
    return list(_LOADED)
