"""The ``megatron`` engine: megatron-core's GPTModel with tensor, pipeline and data parallelism (``engine.py``)."""

from rlflow.engines.megatron.engine import MegatronEngine, MegatronEngineConfig

__all__ = ["MegatronEngine", "MegatronEngineConfig"]
