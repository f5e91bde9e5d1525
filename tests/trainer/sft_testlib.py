"""Shared pieces of the SFT tests: the model and data they train on, configs, and multi-process runs.

* ``sft_assets()``: the tiny preset and the 2-digit addition task files, built once per test
  session (the preset build trains a tokenizer, so it is not repeated per file);
* ``sft_config(overrides)``: the composed and validated ``sft_trainer`` config, as main_sft sees it;
* ``run_ranks(fn, world_size, *args)``: run ``fn(rank, *args)`` on ``world_size`` ranks joined by a gloo
  group with torchrun's environment variables, i.e. what ``trainer.launcher=torchrun`` sees (one rank
  runs in this process, more are spawned);
* ``step_losses(history)``: ``{step: train/loss}`` from a run's metrics.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.trainer.entry_points import compose_sft_config

REPO = Path(__file__).resolve().parents[2]
TASK_OPTIONS = {"digits": 2}


@dataclass(frozen=True)
class SFTAssets:
    """A model folder and synthetic task files: ``sft_train``/``sft_val`` (chat) and ``val`` (RL prompts).

    ``data`` is small (tokenizing costs a few ms per sample and rank): enough batches for
    parity, resume and error tests.
    """

    model: Path
    data: dict[str, Path]


@functools.lru_cache(maxsize=None)
def sft_assets() -> SFTAssets:
    root = Path(tempfile.mkdtemp(prefix="rlflow-sft-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model = build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
    task = build_task("addition", **TASK_OPTIONS)
    data = write_task_files(task, root / "addition_small", n_train=96, n_val=24, seed=0)
    return SFTAssets(model, data)


def sft_config(overrides: list[str]) -> DictConfig:
    """The ``sft_trainer`` config composed with ``overrides`` and validated, as ``main_sft`` builds it."""
    return compose_sft_config(overrides)


def run_main_sft(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m rlflow.trainer.main_sft *args`` from the repo root."""
    return subprocess.run([sys.executable, "-m", "rlflow.trainer.main_sft", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def step_losses(history: list[dict[str, Any]]) -> dict[int, float]:
    return {entry["step"]: entry["train/loss"] for entry in history if "train/loss" in entry}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _run_rank(rank: int, world_size: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world_size: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update({**_torchrun_env(rank, world_size, port), "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    _run_rank(rank, world_size, port, fn, args)


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, *args)`` on ``world_size`` ranks sharing one gloo group (raises if any fails).

    ``world_size`` 1 runs in this process (torchrun's variables set for the call, then restored);
    more ranks are fresh spawned processes.
    """
    port = _free_port()
    if world_size > 1:
        mp.spawn(_spawned, args=(world_size, port, fn, args), nprocs=world_size, join=True)
        return
    saved = {key: os.environ.get(key) for key in _torchrun_env(0, 1, port)}
    os.environ.update(_torchrun_env(0, 1, port))
    try:
        _run_rank(0, 1, port, fn, args)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
