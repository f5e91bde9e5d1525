"""How much memory the vLLM KV cache gets: ``rollout.kv_cache_space_gb`` GiB, or on a GPU
``rollout.gpu_memory_utilization`` of the device memory free when the engine is built.

The rule (``kv_cache_bytes``): a set ``gpu_memory_utilization`` sizes the cache as that fraction of
the free device memory, measured in the rollout worker just before vLLM is built (so memory the
colocated actor already holds is not counted), and ``kv_cache_space_gb`` is then not used. With it
null, the cache is ``kv_cache_space_gb`` GiB. On the CPU there is no device memory to take a
fraction of: a set fraction is refused there (config loading refuses it first when it knows the
device), and ``kv_cache_space_gb`` must be set. vLLM gets the result as ``kv_cache_memory_bytes``.

vLLM also refuses to start unless its own ``gpu_memory_utilization`` share of the whole device is
free; with the cache size given, that share is only this check, so it is set to the share free now
(``vllm_start_budget``), not vLLM's default 0.9, which a colocated actor's memory would fail.
"""

from __future__ import annotations

import math
from typing import Optional

from rlflow.config.validation import ConfigError

GiB = 1 << 30

CPU_FRACTION_REFUSAL = (
    "config key 'rollout.gpu_memory_utilization': it sizes the KV cache as a fraction of free GPU memory, and this "
    "rollout runs on the CPU; leave it null there and size the cache with rollout.kv_cache_space_gb (GiB)"
)
NO_SIZE_REFUSAL = (
    "config keys 'rollout.kv_cache_space_gb' and 'rollout.gpu_memory_utilization' are both null; set the KV cache "
    "in GiB (kv_cache_space_gb) or, on a GPU, as a fraction of free device memory (gpu_memory_utilization)"
)


def check_fraction(fraction: Optional[float]) -> None:
    """``rollout.gpu_memory_utilization`` is null or in (0, 1]."""
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ConfigError(f"config key 'rollout.gpu_memory_utilization': a fraction of free GPU memory in (0, 1], got {fraction}")


def kv_cache_bytes(kv_cache_space_gb: Optional[float], gpu_memory_utilization: Optional[float],
                   free_device_bytes: Optional[int]) -> int:
    """The KV cache size in bytes (the module doc's rule); ``free_device_bytes`` None: the rollout runs on the CPU."""
    check_fraction(gpu_memory_utilization)
    if gpu_memory_utilization is not None:
        if free_device_bytes is None:
            raise ConfigError(CPU_FRACTION_REFUSAL)
        return int(gpu_memory_utilization * free_device_bytes)
    if kv_cache_space_gb is None:
        raise ConfigError(NO_SIZE_REFUSAL)
    return int(float(kv_cache_space_gb) * GiB)


def vllm_start_budget(free_device_bytes: int, total_device_bytes: int) -> float:
    """vLLM's own ``gpu_memory_utilization`` for an engine whose KV cache size is given: the share of the device free
    now, rounded down to a thousandth, so vLLM's start-up check (that share must be free) passes."""
    return math.floor(free_device_bytes / total_device_bytes * 1000) / 1000
