"""Whether a configured engine can run its model folder on the run's ranks, checked before any worker starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.engines.config import EngineConfigError
from rlflow.engines.registry import check_engine_model

__all__ = ["check_engine_fits"]


def check_engine_fits(config: Any, mount: str, model_path: str | Path, model_kind: str, world_size: int) -> None:
    """The engine at ``mount`` can run ``model_path`` on ``world_size`` ranks (``BaseEngine.check_model``), else one
    ``ConfigError`` line naming the key; called once the model folder exists and before any worker starts."""
    node = OmegaConf.to_container(OmegaConf.select(config, mount), resolve=True)
    try:
        check_engine_model(node, model_path, model_kind, world_size)
    except EngineConfigError as error:
        raise ConfigError(f"config key '{mount}': {error}") from None
