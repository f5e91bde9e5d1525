"""The engine lists the suites parametrize over: the engine registry and what each engine declares.

* ``BUILTIN_ENGINES``: the engines rlflow ships (``rlflow/engines/<name>``), which a command line
  names without a plugin. Engines a test module registers in this process (the engine suite's
  ``test_ddp``) are left out, so a suite's parameters do not depend on what else was collected;
* ``builtin_engines_with(*needs)``: those of them whose class declares every capability in ``needs``;
* ``plugin_engines(plugin)``: the engines a plugin file (``trainer.plugins``) registers, and their classes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlflow.engines.base import BaseEngine, Capability
from rlflow.engines.registry import ENGINE_REGISTRY, engines_with
from rlflow.utils.plugins import file_module_name, load_module_file

BUILTIN_ENGINES: tuple[str, ...] = tuple(ENGINE_REGISTRY.discovery.names())


def builtin_engines_with(*needs: Capability) -> tuple[str, ...]:
    """The built-in engines whose class declares every capability in ``needs``."""
    return engines_with(*needs, among=BUILTIN_ENGINES)


def plugin_engines(plugin: Path) -> dict[str, type[BaseEngine]]:
    """The engines the plugin file ``plugin`` registers: ``{name: class}``, in name order.

    A file this process has not imported yet is imported into a throwaway registry state and
    dropped again, so the process is left as it was: a run that names the plugin in
    ``trainer.plugins`` then imports it as a user's run does (the classes returned stay usable
    for reading what they declare).
    """
    module = file_module_name(plugin)
    imported_before = module in sys.modules
    with ENGINE_REGISTRY.temporary():
        load_module_file(plugin)
        found = {name: ENGINE_REGISTRY.get(name) for name in ENGINE_REGISTRY.names() if name not in BUILTIN_ENGINES}
    if not imported_before:
        sys.modules.pop(module)
    return {name: engine_class for name, engine_class in found.items() if engine_class.__module__ == module}
