"""Engine registry: ``@EngineRegistry.register("name")`` on a ``BaseEngine`` subclass.

Built-in engines live in ``rlflow/engines/<name>.py`` and are imported on first
lookup, so asking for ``fsdp2`` never imports megatron. An engine defined elsewhere
is registered by importing its module before ``build_engine`` runs.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable, Mapping

from rlflow.engines.base import BaseEngine
from rlflow.engines.config import EngineConfig, EngineConfigError, config_from_mapping

__all__ = ["EngineRegistry", "build_engine", "get_engine_cls"]


class EngineRegistry:
    """Name -> engine class table."""

    _engines: dict[str, type[BaseEngine]] = {}

    @classmethod
    def register(cls, name: str) -> Callable[[type[BaseEngine]], type[BaseEngine]]:
        """Class decorator registering an engine under ``name`` (its config's ``name`` value)."""

        def decorator(engine_cls: type[BaseEngine]) -> type[BaseEngine]:
            if not (isinstance(engine_cls, type) and issubclass(engine_cls, BaseEngine)):
                raise TypeError(f"@EngineRegistry.register({name!r}) needs a BaseEngine subclass, got {engine_cls!r}")
            existing = cls._engines.get(name)
            if existing is not None and existing.__qualname__ != engine_cls.__qualname__:
                raise ValueError(f"engine name {name!r} is already registered by {existing.__module__}.{existing.__qualname__}")
            cls._engines[name] = engine_cls
            return engine_cls

        return decorator

    @classmethod
    def names(cls) -> list[str]:
        """Registered names plus built-in engine modules not imported yet."""
        return sorted(set(cls._engines) | set(_builtin_engine_modules()))

    @classmethod
    def get(cls, name: str) -> type[BaseEngine]:
        """The class registered as ``name``; imports ``rlflow.engines.<name>`` on first use."""
        if name not in cls._engines and name in _builtin_engine_modules():
            importlib.import_module(f"rlflow.engines.{name}")
        if name not in cls._engines:
            raise EngineConfigError(f"unknown engine {name!r}; registered engines: {', '.join(cls.names())}")
        return cls._engines[name]


def _builtin_engine_modules() -> list[str]:
    package_dir = Path(__file__).parent
    infrastructure = {"base", "config", "registry"}
    return [
        path.stem
        for path in package_dir.glob("*.py")
        if not path.stem.startswith("_") and path.stem not in infrastructure
    ]


def get_engine_cls(name: str) -> type[BaseEngine]:
    """The engine class registered as ``name`` (error lists the registered engines)."""
    return EngineRegistry.get(name)


def build_engine(
    config: EngineConfig | Mapping[str, Any], model_path: str | Path, model_kind: str = "causal_lm"
) -> BaseEngine:
    """Construct (not initialize) the engine named by ``config.name``, validating ``config`` against its dataclass."""
    name = config.name if isinstance(config, EngineConfig) else (config or {}).get("name")
    if not name:
        raise EngineConfigError(f"engine config needs a 'name'; registered engines: {', '.join(EngineRegistry.names())}")
    engine_cls = get_engine_cls(str(name))
    return engine_cls(config_from_mapping(engine_cls.config_class, config), model_path, model_kind)
