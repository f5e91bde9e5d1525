"""Engines: models + parallelism + optimizers behind one contract (``BaseEngine``), picked by name.

    from rlflow.engines import build_engine
    engine = build_engine({"name": "fsdp2", "micro_batch_size": 4}, model_path="outputs/models/tiny")
    engine.initialize()

Built-in engines (``fsdp``, ``fsdp2``, ...) are imported on first lookup by name.
"""

from rlflow.engines.base import BaseEngine, EngineMesh, LossContext, LossFn
from rlflow.engines.config import EngineConfig, EngineConfigError, LRSchedulerConfig, OptimizerConfig
from rlflow.engines.registry import EngineRegistry, build_engine, get_engine_cls

__all__ = [
    "BaseEngine",
    "EngineConfig",
    "EngineConfigError",
    "EngineMesh",
    "EngineRegistry",
    "LRSchedulerConfig",
    "LossContext",
    "LossFn",
    "OptimizerConfig",
    "build_engine",
    "get_engine_cls",
]
