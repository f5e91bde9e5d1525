"""Engine registry: ``@ENGINE_REGISTRY.register("name")`` on a ``BaseEngine`` subclass.

Built-in engines are the modules ``rlflow/engines/<name>.py`` and the packages
``rlflow/engines/<name>/``. ``ENGINE_REGISTRY.names()`` lists them without importing them;
the first lookup of a name imports that one, so asking for ``fsdp2`` never imports megatron.
An engine defined elsewhere is registered by importing its module before ``build_engine`` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from rlflow.engines.base import BaseEngine, Capability
from rlflow.engines.config import EngineConfig, EngineConfigError, config_from_mapping
from rlflow.utils.registry import PackageDiscovery, Registry

__all__ = ["ENGINE_INFRASTRUCTURE", "ENGINE_REGISTRY", "build_engine", "check_engine_model", "engines_with", "get_engine_cls"]

# Modules and packages of rlflow/engines that are shared machinery, not engines.
ENGINE_INFRASTRUCTURE = ("base", "config", "registry", "common")

ENGINE_REGISTRY: Registry[type[BaseEngine]] = Registry(
    "engine",
    "engine.name",
    error=EngineConfigError,
    base=BaseEngine,
    discovery=PackageDiscovery(__package__, exclude=ENGINE_INFRASTRUCTURE),
)


def get_engine_cls(name: str) -> type[BaseEngine]:
    """The engine class registered as ``name`` (error lists the registered engines)."""
    return ENGINE_REGISTRY.get(name)


def engines_with(*needs: Capability, among: Optional[Iterable[str]] = None) -> tuple[str, ...]:
    """The engines of ``among`` (default: every registered one), in order, whose class declares every
    capability in ``needs`` (``BaseEngine.capabilities``). Looking at a built-in engine imports it."""
    names = ENGINE_REGISTRY.names() if among is None else among
    return tuple(name for name in names if set(needs) <= get_engine_cls(name).capabilities)


def build_engine(
    config: EngineConfig | Mapping[str, Any], model_path: str | Path, model_kind: str = "causal_lm"
) -> BaseEngine:
    """Construct (not initialize) the engine named by ``config.name``, validating ``config`` against its dataclass."""
    name = config.name if isinstance(config, EngineConfig) else (config or {}).get("name")
    if not name:
        raise EngineConfigError(f"engine config needs a 'name'; registered engines: {', '.join(ENGINE_REGISTRY.names())}")
    engine_cls = get_engine_cls(str(name))
    return engine_cls(config_from_mapping(engine_cls.config_class, config), model_path, model_kind)


def check_engine_model(
    config: EngineConfig | Mapping[str, Any], model_path: str | Path, model_kind: str, world_size: int
) -> None:
    """``BaseEngine.check_supported`` and ``check_model`` of the engine ``config`` names (its config validated
    first): before any worker starts, whether the engine has what the config and the role's ``model_kind`` need and
    can run ``model_path`` on ``world_size`` ranks (``EngineConfigError`` if not)."""
    name = config.name if isinstance(config, EngineConfig) else (config or {}).get("name")
    engine_cls = get_engine_cls(str(name))
    engine_config = config_from_mapping(engine_cls.config_class, config)
    engine_cls.check_supported(engine_config, model_kind)
    engine_cls.check_model(engine_config, model_path, model_kind, world_size)
