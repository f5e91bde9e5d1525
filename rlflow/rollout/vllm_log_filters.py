"""vLLM's warnings that every healthy run prints, handled where vLLM logs them (any other warning passes as it is).

* Dropped: ``RotaryEmbedding: Failed to load weights``, once per weight sync. vLLM's layerwise reload
  (``model_loader/reload/layerwise.py``) warns for a layer that got none of its tensors; a rotary
  embedding has none to get (its cos/sin cache is computed from the config, not loaded) and vLLM
  puts the cache back right after the warning.
* Demoted to INFO (so they reach the run folder's log file, not the console; ``rlflow.utils.log_routing``):
  the notices vLLM prints on every CPU run about settings rlflow chooses on purpose (eager mode, no
  chunked prefill, its own seeds, its own thread count) or about optional CPU libraries (Triton,
  tcmalloc, libiomp), the notices of a second engine in one process (its kernels registered again,
  ``VLLM_DIST_IDENT`` set by the first), and torch's ``reduce_op`` deprecation warning that vLLM's
  import triggers.
"""

from __future__ import annotations

import logging
import warnings

_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_FAILED_TO_LOAD = "%s: Failed to load weights"

# vLLM logger -> the starts of the per-run notices it logs as warnings.
DEMOTED_NOTICES: dict[str, tuple[str, ...]] = {
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    "vllm.engine.arg_utils": ("The global random seed is set to", "This model does not officially support disabling chunked prefill"),
    "vllm.config.vllm": ("Enforce eager set", "Inductor compilation was disabled", "Model Runner V2 requires Triton"),
    "vllm.platforms.cpu": ("Triton is not installed", "CPU backend prefers block_size"),
    "vllm.v1.worker.cpu_worker": ("libtcmalloc is not found", "libiomp is not found",
                                  "CPU backend doesn't allow to use `torch.set_num_threads`"),
    # A second engine in one process (the report evaluates three models): vLLM's own CPU worker set the variable,
    # and the engine's kernels are registered again.
    "vllm.platforms.interface": ("Unknown vLLM environment variable detected: VLLM_DIST_IDENT",),
    "vllm.triton_utils.dispatcher": ("Kernel ",),
}


class _RotaryReloadFilter(logging.Filter):
    """Drops the reload warning for rotary-embedding layers (any class whose name ends in ``RotaryEmbedding``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        return not (record.msg == _FAILED_TO_LOAD and str(layer).endswith("RotaryEmbedding"))


class _DemoteNotices(logging.Filter):
    """Turns a warning that starts with one of ``prefixes`` into an INFO record."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(self.prefixes):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_ROTARY_RELOAD_FILTER = _RotaryReloadFilter()
_DEMOTE_FILTERS = {name: _DemoteNotices(prefixes) for name, prefixes in DEMOTED_NOTICES.items()}


def drop_expected_vllm_warnings() -> None:
    """Install the filters on vLLM's loggers (before or after vLLM is imported; idempotent)."""
    logging.getLogger(_RELOAD_LOGGER).addFilter(_ROTARY_RELOAD_FILTER)
    for name, demote in _DEMOTE_FILTERS.items():
        logging.getLogger(name).addFilter(demote)
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
