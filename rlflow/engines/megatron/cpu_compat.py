"""What the megatron engine changes on CPU, and only there (measured facts: ``../shared/PLATFORM.md``).

megatron-core 0.16 calls CUDA directly in a handful of places. The engine runs every megatron
call (model construction, the schedules, DDP's buffers and hooks, gradient finalisation) inside
``cpu_megatron()`` when its device is the CPU; on CUDA none of this runs. Each patch names the
megatron call it serves:

* ``torch.cuda.current_device()`` -> the CPU device: rotary ``inv_freq``, the TP gather/scatter
  buffers (``tensor_parallel.mappings``), ``ColumnParallelLinear``'s weight placement, the p2p
  shape exchange (``pipeline_parallel.p2p_communication``) and DDP's grad buffers
  (``distributed.param_and_grad_buffer``);
* a ``"cuda"`` device given to a tensor factory (``torch.zeros`` ...) in megatron's schedules
  (``pipeline_parallel.schedules``: ``total_num_tokens``) -> the CPU. Only that module's ``torch``
  is replaced (by ``_CpuFactories``): patching ``torch.zeros`` itself would leak, since torch caches
  the set of its factory functions (``torch.utils._device``) the first time a device context
  needs it, and a wrapper cached there breaks ``with torch.device(...)`` for the whole process;
* ``torch.cuda.synchronize`` / ``empty_cache`` -> no-ops (p2p communication, DDP);
* ``Tensor.cuda()`` -> the tensor itself: ``LanguageModule.setup_embeddings_and_output_layer``
  moves the tied output-layer copy with ``weight.data.cuda()`` before the all-reduce that makes it
  equal the first stage's embeddings (pipeline parallelism with tied embeddings);
* the CUDA RNG tracker (``tensor_parallel.random``): ``model_parallel_cuda_manual_seed`` needs CUDA
  generators, so on CPU the tracker is megatron's inference tracker (``fork()`` does nothing), and
  activation recomputation (``tensor_parallel.checkpoint``), which saves and restores the CPU and
  CUDA RNG states around each recomputed layer, gets an empty CUDA state (``_get_cuda_rng_state``,
  ``_set_cuda_rng_state``); the CPU state it keeps is the one dropout draws from here.
  Dropout then draws from each process's CPU generator, uncoordinated across ranks, so the engine
  refuses attention dropout under tensor parallelism on CPU (``cpu_rng_tracker``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import torch
from megatron.core.pipeline_parallel import schedules as megatron_schedules
from megatron.core.tensor_parallel import random as megatron_random

__all__ = ["cpu_megatron", "cpu_rng_tracker"]

_CPU = torch.device("cpu")
_FACTORIES = ("zeros", "empty", "ones", "full", "tensor")
_NO_CUDA_RNG = torch.empty(0, dtype=torch.uint8)


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    return isinstance(device, int) or torch.device(device).type == "cuda"  # an int is a CUDA ordinal


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def build(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = _CPU
        return factory(*args, **kwargs)

    return build


class _CpuFactories:
    """The ``torch`` module as one megatron module sees it: its tensor factories put a ``"cuda"`` tensor on the CPU."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        return _on_cpu(value) if name in _FACTORIES else value


@contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _tensor_cuda(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@contextmanager
def cpu_megatron() -> Iterator[None]:
    """Inside: megatron's direct CUDA calls land on the CPU (the module docstring lists each). Re-entrant."""
    with ExitStack() as patches:
        patches.enter_context(_patched(torch.cuda, "current_device", lambda: _CPU))
        patches.enter_context(_patched(torch.cuda, "synchronize", lambda *args, **kwargs: None))
        patches.enter_context(_patched(torch.cuda, "empty_cache", lambda: None))
        patches.enter_context(_patched(torch.Tensor, "cuda", _tensor_cuda))
        patches.enter_context(_patched(megatron_random, "_get_cuda_rng_state", lambda *args, **kwargs: _NO_CUDA_RNG))
        patches.enter_context(_patched(megatron_random, "_set_cuda_rng_state", lambda *args, **kwargs: None))
        patches.enter_context(_patched(megatron_schedules, "torch", _CpuFactories()))
        yield


def cpu_rng_tracker() -> None:
    """Megatron's RNG tracker without CUDA generators (replaces ``model_parallel_cuda_manual_seed`` on CPU)."""
    megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
