"""Measured machine limits and process memory, shared by the benches.

* ``matmul_peak_gflops``: the fp32 matmul rate of the whole machine measured the way the FLOP
  limit needs it: one single-threaded process per core, all running a big square matmul at the
  same time, rates summed.
* ``cuda_matmul_peak_gflops``: the same rate on the GPU at a given dtype, with PyTorch's default
  matmul precision (no TF32 for fp32 unless the process asked for it).
* ``PeakRSS``: samples the resident set size of a process and its descendants in a background
  thread and keeps each one's peak, labelled by what the process is.

Importable as ``machine_limits`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from typing import Callable

import psutil


def _matmul_worker(size: int, seconds: float, start: "mp.synchronize.Barrier", out: "mp.Queue") -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up (allocations, kernel choice)
    start.wait()
    count, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < seconds:
        torch.mm(a, b)
        count += 1
    elapsed = time.perf_counter() - begin
    out.put(2 * size**3 * count / elapsed / 1e9)


def matmul_peak_gflops(processes: int | None = None, size: int = 1024, seconds: float = 3.0) -> list[float]:
    """fp32 GFLOP/s of each of ``processes`` (default: one per core) 1-thread processes running at once."""
    processes = processes or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_matmul_worker, args=(size, seconds, barrier, out)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    rates = [out.get(timeout=seconds + 120) for _ in workers]
    for worker in workers:
        worker.join()
    return rates


def cuda_matmul_peak_gflops(dtype: str = "float32", size: int = 8192, seconds: float = 2.0) -> float:
    """GFLOP/s of a square ``size`` matmul at ``dtype`` on the current GPU, timed over ``seconds``."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn_like(a)
    torch.mm(a, b)  # warm-up (cuBLAS handle, kernel choice)
    torch.cuda.synchronize()
    count, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < seconds:
        for _ in range(5):
            torch.mm(a, b)
        torch.cuda.synchronize()
        count += 5
    return 2 * size**3 * count / (time.perf_counter() - begin) / 1e9


def default_label(process: psutil.Process) -> str:
    """``<name>:<pid>``; Ray workers are named by their title (``ray::WorkerHost`` ...)."""
    try:
        title = " ".join(process.cmdline())
    except psutil.Error:
        title = ""
    # a Ray worker's title names the method it runs now (ray::WorkerHost.call): keep the class only
    name = title.split()[0].split(".")[0] if title.startswith("ray::") else process.name()
    return f"{name}:{process.pid}"


class PeakRSS(threading.Thread):
    """Peak RSS (MiB) of a root process and every descendant, sampled every ``interval`` seconds."""

    def __init__(self, root_pid: int, interval: float = 0.5, label: Callable[[psutil.Process], str] = default_label):
        super().__init__(daemon=True)
        self.root, self.interval, self.label = psutil.Process(root_pid), interval, label
        self.peaks_mb: dict[str, float] = {}
        self.seen: dict[int, psutil.Process] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            for process in processes:
                try:
                    rss = process.memory_info().rss / 2**20
                    key = "driver" if process.pid == self.root.pid else self.label(process)
                except psutil.Error:
                    continue
                self.seen.setdefault(process.pid, process)
                self.peaks_mb[key] = max(rss, self.peaks_mb.get(key, 0.0))

    def stop(self) -> dict[str, float]:
        """Stop sampling; the peaks, largest first."""
        self._stop_event.set()
        self.join()
        return dict(sorted(self.peaks_mb.items(), key=lambda item: -item[1]))

    def wait_for_exit(self, timeout: float = 120.0) -> list[int]:
        """Wait until every process seen has exited (a run's leftovers, e.g. Ray's daemons, would slow the
        next run); the pids still alive after ``timeout``."""
        _, alive = psutil.wait_procs(list(self.seen.values()), timeout=timeout)
        return [process.pid for process in alive]
