"""Freed memory kept in the heap on a CPU run (``rlflow.utils.cpu_heap``): a large tensor allocated again
faults no pages in, in a CPU worker process; without it every allocation faults its pages anew."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlflow.utils.cpu_heap import ENV_RETAIN_HEAP
from rlflow.workers import ray_cluster

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PAGES = 64 * 2**20 // 4096  # a 64 MiB tensor: above glibc's largest mmap threshold (32 MiB)

WARM_UP, MEASURED = 16, 4  # allocations; in a worker the heap settled after at most 8 (64 MiB each)

# A fresh process per case: the setting is process-wide and glibc's heap state must start clean.
_PROBE = r"""
import resource, sys
WARM_UP, MEASURED = int(sys.argv[2]), int(sys.argv[3])
import torch
from rlflow.utils.cpu_heap import retain_freed_memory
from rlflow.workers.worker import WorkerContext, setup_worker_process

if sys.argv[1] == "worker":
    setup_worker_process(WorkerContext.from_env())
elif sys.argv[1] == "direct":
    print(int(retain_freed_memory()), end=" ")

def faults_of_one_tensor():  # allocated, every page written, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

for _ in range(WARM_UP):  # the heap grows until a freed block fits the next aligned request
    faults_of_one_tensor()
print(sum(faults_of_one_tensor() for _ in range(MEASURED)))
"""


def _faults(mode: str, **env: str) -> str:
    environment = {**os.environ, "RLFLOW_DEVICE": "cpu", **env}
    environment.pop("MASTER_PORT", None)
    command = [sys.executable, "-c", _PROBE, mode, str(WARM_UP), str(MEASURED)]
    out = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_cpu_worker_reuses_freed_memory_instead_of_faulting_it_in_again() -> None:
    accepted, retained_faults = _faults("direct").split()
    assert accepted == "1"  # mallopt took both settings
    retained = int(retained_faults)
    in_worker = int(_faults("worker"))
    assert retained < PAGES // 100 and in_worker < PAGES // 100, (retained, in_worker)  # of MEASURED x PAGES
    if "[always]" in (THP_MODE.read_text() if THP_MODE.exists() else ""):
        return  # fresh mappings fault in 2 MiB pages there: the controls below cannot tell the two apart
    plain = int(_faults("plain"))
    switched_off = int(_faults("worker", **{ENV_RETAIN_HEAP: "0"}))
    assert plain > MEASURED * PAGES // 2 and switched_off > MEASURED * PAGES // 2, (plain, switched_off)


def test_init_ray_passes_the_drivers_setting_to_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(ray_cluster.ray, "cluster_resources", dict)
    monkeypatch.setenv(ENV_RETAIN_HEAP, "0")
    ray_cluster.init_ray(address="ray://head:10001", runtime_env={"env_vars": {"EXTRA": "1"}})
    assert seen["runtime_env"]["env_vars"][ENV_RETAIN_HEAP] == "0"
    assert seen["runtime_env"]["env_vars"]["EXTRA"] == "1"
    assert seen["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
