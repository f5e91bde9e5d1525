"""The rollout's KV cache sizing, checked before Ray starts: ``rollout.gpu_memory_utilization`` is a fraction of free
GPU memory (refused when the rollout runs on the CPU), and one of it and ``rollout.kv_cache_space_gb`` is set.

The rule itself, and the same refusals for a device config loading cannot know (a joined Ray
cluster), are in ``rlflow/rollout/kv_cache.py``, which the rollout worker applies.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlflow.config import ConfigError
from rlflow.config.loading.dtype_guard import compute_device
from rlflow.rollout.kv_cache import CPU_FRACTION_REFUSAL, NO_SIZE_REFUSAL, check_fraction


def check_rollout_memory(config: DictConfig) -> None:
    """One ``ConfigError`` line for a KV cache the rollout could not size on its device."""
    rollout = config.rollout
    check_fraction(rollout.gpu_memory_utilization)
    if rollout.gpu_memory_utilization is None and rollout.kv_cache_space_gb is None:
        raise ConfigError(NO_SIZE_REFUSAL)
    if rollout.gpu_memory_utilization is not None and compute_device(config, None) == "cpu":
        raise ConfigError(CPU_FRACTION_REFUSAL)
