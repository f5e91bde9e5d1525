"""The ``torchtitan`` engine: torchtitan's decoder models and parallelisms with HF weights (``engine.py``)."""

from rlflow.engines.torchtitan.engine import TorchtitanEngine, TorchtitanEngineConfig

__all__ = ["TorchtitanEngine", "TorchtitanEngineConfig"]
