"""The ``megatron`` engine: megatron-core's GPTModel with tensor, pipeline and data parallelism (``engine.py``).

Importing megatron-core has two process-wide side effects this package undoes:

* it warns that TransformerEngine and Apex are absent and that it falls back to torch's
  implementations; that is how this engine runs it (its local layer spec), so those notices are
  silenced during the import, every other warning passes;
* it adds its ``SAFE_GLOBALS`` (numpy arrays and dtypes, argparse namespaces, its own enums and
  configs) to torch's ``weights_only`` unpickling allowlist for its dist-checkpointing, which this
  engine does not use. That would widen what every ``torch.load(weights_only=True)`` in the
  process accepts (an old pickled RNG state would load and then fail oddly instead of being
  refused in one line), so its entries are taken out again (whichever import of megatron-core
  added them).
"""

import warnings

import torch

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"(Transformer Engine and Apex are|Apex is) not installed", category=UserWarning)
    from megatron.core.safe_globals import SAFE_GLOBALS as _MEGATRON_SAFE_GLOBALS

    from rlflow.engines.megatron.engine import MegatronEngine, MegatronEngineConfig

_kept = [entry for entry in torch.serialization.get_safe_globals() if entry not in _MEGATRON_SAFE_GLOBALS]
torch.serialization.clear_safe_globals()
torch.serialization.add_safe_globals(_kept)

__all__ = ["MegatronEngine", "MegatronEngineConfig"]
