"""What the CPU can compute natively: read /proc/cpuinfo once, and time a half-precision matmul.

torch runs bf16 (and fp16) matmuls fast on a CPU only when it has the instructions for that
dtype (AVX-512 BF16 or AMX on x86, the BF16 extension on Arm). Without them, the backward's
matmuls fall back to a generic loop that was measured 9-35x slower than fp32 on an AVX2-only
AMD EPYC (docs/platform.md). Config loading uses this module to refuse such a setting on the
CPU before anything starts (``rlflow.config.loading.dtype_guard``); the benches print ``describe()``.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
# dtype -> the cpuinfo flags of which any one means native matmul instructions for it.
# x86: AVX-512 BF16/FP16 and AMX tiles; aarch64 (a "Features" line): the BF16 extension, half-precision SIMD.
NATIVE_FLAGS: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16", "bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16", "asimdhp"),
}
_MODEL_KEYS = ("model name", "Model")  # x86 (and some Arm kernels), then boards such as the Raspberry Pi
_FLAG_KEYS = ("flags", "Features")


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's model name and instruction-set flags (as /proc/cpuinfo lists them)."""

    model: str
    flags: frozenset[str]

    def has_native(self, dtype: torch.dtype) -> bool:
        """True when matmuls in ``dtype`` run on instructions made for it (always true for fp32)."""
        return dtype not in NATIVE_FLAGS or any(flag in self.flags for flag in NATIVE_FLAGS[dtype])

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def has_amx(self) -> bool:
        return any(flag.startswith("amx") for flag in self.flags)

    def describe(self) -> str:
        """One line for logs and bench output: model, native bf16/fp16, AVX-512, AMX."""
        yes_no = {True: "yes", False: "no"}
        return (f"{self.model}; native bf16 {yes_no[self.has_native(torch.bfloat16)]}, "
                f"fp16 {yes_no[self.has_native(torch.float16)]}, avx512 {yes_no[self.has_avx512]}, "
                f"amx {yes_no[self.has_amx]}")


def _first_value(lines: list[str], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        for line in lines:
            name, sep, value = line.partition(":")
            if sep and name.strip() == key:
                return value.strip()
    return None


def parse_cpuinfo(text: str) -> CpuFeatures:
    """The first processor's model name and flags from the text of /proc/cpuinfo."""
    lines = text.splitlines()
    model = _first_value(lines, _MODEL_KEYS) or platform.processor() or "unknown CPU"
    return CpuFeatures(model=model, flags=frozenset((_first_value(lines, _FLAG_KEYS) or "").split()))


@lru_cache(maxsize=1)
def read_cpu_features() -> CpuFeatures:
    """This machine's ``CpuFeatures`` (no flags where /proc/cpuinfo does not exist, e.g. macOS)."""
    return parse_cpuinfo(CPUINFO.read_text() if CPUINFO.is_file() else "")


def _linear_step_seconds(dtype: torch.dtype, size: int, repeats: int) -> float:
    """Best time of one linear layer's three matmuls (forward, grad input, grad weight) in ``dtype``."""
    x, weight, grad = (torch.randn(size, size).to(dtype) for _ in range(3))
    best = float("inf")
    for _ in range(repeats + 1):  # the first run warms the kernels up and is not counted
        start = time.perf_counter()
        x @ weight.t(), grad @ weight, grad.t() @ x
        best = min(best, time.perf_counter() - start)
    return best


@lru_cache(maxsize=None)
def measure_slowdown(dtype: torch.dtype, size: int = 256, repeats: int = 2) -> float:
    """How many times slower ``dtype`` matmuls run than fp32 here; measured once per process (about 0.2 s without native instructions)."""
    return _linear_step_seconds(dtype, size, repeats) / _linear_step_seconds(torch.float32, size, repeats)
