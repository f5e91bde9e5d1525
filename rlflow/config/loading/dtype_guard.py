"""Refuse a half-precision compute dtype on a CPU that has no instructions for it, before Ray starts.

On a CPU without AVX-512 BF16 / AMX (an AVX2-only AMD EPYC here), torch's bf16 and fp16
matmuls run in a generic loop: measured 9-35x slower than fp32, and a bf16 GRPO step did not
finish its first backward in 10 minutes against 22 s at fp32 (docs/platform.md). Config loading
calls ``check_half_precision`` with the keys of its entry point; a bf16/fp16 value on such a CPU
is one ``ConfigError`` line naming the key, the CPU, the slowdown measured on the spot and
``trainer.allow_slow_half_precision``, the switch that lets it through. Keys whose compute runs
on CUDA are never checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from rlflow.config import ConfigError
from rlflow.models.hf_checkpoint import resolve_dtype
from rlflow.utils import cpu_features
from rlflow.utils.device import is_accelerator_available
from rlflow.utils.logging import get_logger

ALLOW_KEY = "trainer.allow_slow_half_precision"
_ENGINE_COMPUTE_KEYS = ("dtype", "param_dtype")  # reduce_dtype only sums gradients: no matmul runs in it
_logger = get_logger(__name__)


@dataclass(frozen=True)
class ComputeDtypeKey:
    """A config key naming a dtype that matmuls run in, and the key naming the device they run on.

    ``device_key`` None (or its value ``auto``) means the run's ``trainer.device``.
    """

    key: str
    device_key: Optional[str] = None


def engine_dtype_keys(mount: str) -> list[ComputeDtypeKey]:
    """The compute dtype keys of the engine mounted at ``mount`` (``actor.engine`` ...)."""
    return [ComputeDtypeKey(f"{mount}.{name}", f"{mount}.device") for name in _ENGINE_COMPUTE_KEYS]


def ppo_dtype_keys(engine_mounts: Iterable[str]) -> list[ComputeDtypeKey]:
    """Every compute dtype key of ``main_ppo``: the rollout's and each engine's."""
    return [ComputeDtypeKey("rollout.dtype"), *(key for mount in engine_mounts for key in engine_dtype_keys(mount))]


def sft_dtype_keys(engine_mounts: Iterable[str]) -> list[ComputeDtypeKey]:
    """Every compute dtype key of ``main_sft``: its engine's."""
    return [key for mount in engine_mounts for key in engine_dtype_keys(mount)]


def compute_device(config: DictConfig, device_key: Optional[str]) -> Optional[str]:
    """``cpu`` or ``cuda`` for a key's compute, or None when this process cannot know it.

    ``auto`` is the accelerator when this process sees one. Otherwise it is the CPU of this
    machine, unless ``trainer.ray_address`` joins a cluster, whose workers may sit elsewhere.
    """
    own = OmegaConf.select(config, device_key, default="auto") if device_key else "auto"
    device = own if own != "auto" else OmegaConf.select(config, "trainer.device", default="auto")
    if device != "auto":
        return device
    if is_accelerator_available():
        return "cuda"
    return None if OmegaConf.select(config, "trainer.ray_address", default=None) else "cpu"


def _refusal(key: str, dtype: torch.dtype, cpu: cpu_features.CpuFeatures) -> str:
    name = str(dtype).removeprefix("torch.")
    slowdown = cpu_features.measure_slowdown(dtype)
    flags = ", ".join(cpu_features.NATIVE_FLAGS[dtype])
    return (f"config key '{key}': {name} compute is refused on this CPU ({cpu.model}): it has no native {name} "
            f"instructions (none of the cpuinfo flags {flags}), so {name} matmuls run {slowdown:.0f}x slower than "
            f"float32 here (measured just now; docs/platform.md); use float32, or set {ALLOW_KEY}=true to run it anyway")


def check_half_precision(config: DictConfig, keys: Iterable[ComputeDtypeKey]) -> None:
    """Raise a one-line ``ConfigError`` for a bf16/fp16 key computed on a CPU without native instructions for it."""
    cpu = cpu_features.read_cpu_features()
    allowed = bool(OmegaConf.select(config, ALLOW_KEY, default=False))
    for entry in keys:
        value = OmegaConf.select(config, entry.key, default=None)
        if value is None or compute_device(config, entry.device_key) != "cpu":
            continue
        dtype = resolve_dtype(str(value))
        if cpu.has_native(dtype):
            continue
        if not allowed:
            raise ConfigError(_refusal(entry.key, dtype, cpu))
        _logger.warning("%s=%s on a CPU without native instructions for it (%s=true): expect it to run many times "
                        "slower than float32 (docs/platform.md)", entry.key, value, ALLOW_KEY)
