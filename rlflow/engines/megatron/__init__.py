"""The ``megatron`` engine: megatron-core's GPTModel with tensor, pipeline and data parallelism (``engine.py``).

megatron-core warns at import that TransformerEngine and Apex are absent and that it falls back to
torch's implementations; that is how this engine runs it (its local layer spec), so the import
is quiet about it. Every other warning passes.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"(Transformer Engine and Apex are|Apex is) not installed", category=UserWarning)
    from rlflow.engines.megatron.engine import MegatronEngine, MegatronEngineConfig

__all__ = ["MegatronEngine", "MegatronEngineConfig"]
