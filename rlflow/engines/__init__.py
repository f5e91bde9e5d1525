"""Engines: models + parallelism + optimizers behind one contract (``BaseEngine``), picked by name.

    from rlflow.engines import build_engine
    engine = build_engine({"name": "fsdp2", "micro_batch_size": 4}, model_path="outputs/models/tiny")
    engine.initialize()

Built-in engines (``fsdp``, ``fsdp2``, ...) are imported on first lookup by name. A new engine subclasses
one of three bases (docs/engines.md, "Adding an engine"): ``ModuleEngine`` (one torch module that a
data-parallel wrapper shards or replicates), ``DelegatingEngine`` (a model and a schedule of its own, the
shared optimizer step and offload) or ``BaseEngine`` (nothing shared). The parts they compose are in
``rlflow.engines.common`` (``forward/``, ``batching/``, ``checkpoint/``, ``optim/``, ``fsdp/``).
"""

from rlflow.engines.base import BaseEngine, Capability, EngineMesh, LossContext, LossFn
from rlflow.engines.common.delegating_engine import DelegatingEngine
from rlflow.engines.common.module_engine import ModuleEngine
from rlflow.engines.config import (
    EngineConfig,
    EngineConfigError,
    HFModuleEngineConfig,
    LRSchedulerConfig,
    OptimizerConfig,
    StepHyperparams,
)
from rlflow.engines.registry import ENGINE_REGISTRY, build_engine, get_engine_cls

__all__ = [
    "BaseEngine",
    "Capability",
    "DelegatingEngine",
    "EngineConfig",
    "EngineConfigError",
    "EngineMesh",
    "ENGINE_REGISTRY",
    "HFModuleEngineConfig",
    "LRSchedulerConfig",
    "LossContext",
    "LossFn",
    "ModuleEngine",
    "OptimizerConfig",
    "StepHyperparams",
    "build_engine",
    "get_engine_cls",
]
