"""The checkpoint scenarios of the engine suite; spawned, rank 0 saves what the tests check.

* ``checkpoint_suite`` (2 ranks): every engine trains 3 steps and saves ``ckpt_<engine>``, then
  records the live engine's outputs on ``PROBE_SEED`` (log-probs and entropy: what
  ``rlflow-export`` must reproduce) and its exported weights, and trains 3 more steps (the
  uninterrupted run); a fresh engine loads the save and trains the same 3 steps.
* ``reshard_suite`` (1 rank): every engine declaring ``Capability.RESHARD`` loads the 2-rank
  checkpoint and trains those 3 steps at world size 1, with ``RESUMED_KERNELS`` for AdamW.
* ``checkpoint_errors_suite`` (1 rank): a missing checkpoint, another engine's, and a 2-rank
  checkpoint of an engine that cannot reshard.
* ``killed_save`` / ``resume_after_kill``: a save SIGKILLed mid-write leaves the previous one.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from engine_testlib import ENGINES, engine_config, engines_with, make_batch, new_engine, save_results, train_steps
from rlflow.engines.base import Capability
from rlflow.errors import CheckpointError

SCHEDULE = {"name": "cosine", "warmup_steps": 2, "total_steps": 8, "min_lr_ratio": 0.1}
BATCH_SEEDS = range(20, 26)  # steps 1-3 before the save, 4-6 after it
PROBE_SEED = 27
RESUMED_KERNELS = "fused"  # the reshard suite resumes with other AdamW kernels than the save's (the default)


def _config(name: str) -> dict[str, Any]:
    return engine_config(name, micro_batch_size=2, lr_scheduler=SCHEDULE)


def probe_batch():
    batch = make_batch(PROBE_SEED)
    batch.meta_info["compute_entropy"] = True
    return batch


def checkpoint_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    batches = [make_batch(seed) for seed in BATCH_SEEDS]
    results: dict[str, Any] = {}
    for name in ENGINES:
        path = out_dir / f"ckpt_{name}"
        first = new_engine(_config(name), model_path)
        train_steps(first, batches[:3], rank, world_size)
        first.save_checkpoint(path)
        probe, _ = first.forward_backward(probe_batch(), forward_only=True)
        weights = {n: t.clone() for n, t in first.export_hf_weights()}
        uninterrupted = train_steps(first, batches[3:], rank, world_size)
        resumed_engine = new_engine(_config(name), model_path)
        resumed_engine.load_checkpoint(path)
        resumed = train_steps(resumed_engine, batches[3:], rank, world_size)
        results[name] = {"uninterrupted": uninterrupted, "resumed": resumed, "files": sorted(os.listdir(path)),
                         "probe": {k: probe.batch[k] for k in ("log_probs", "entropy")}, "weights": weights}
    save_results(rank, out_dir, "checkpoint.pt", results)


def reshard_suite(rank: int, world_size: int, model_path: Path, two_rank_out: Path, out_dir: Path) -> None:
    batches = [make_batch(seed) for seed in BATCH_SEEDS]
    results: dict[str, Any] = {}
    for name in engines_with(Capability.RESHARD):
        config = _config(name)
        config["optimizer"] = {**config["optimizer"], "implementation": RESUMED_KERNELS}  # the save ran foreach
        engine = new_engine(config, model_path)
        engine.load_checkpoint(two_rank_out / f"ckpt_{name}")
        rng_after_load = torch.get_rng_state()
        kernels = [(group["fused"], group["foreach"]) for group in engine.optimizer.param_groups]
        results[name] = {"resumed": train_steps(engine, batches[3:], rank, world_size), "rng_after_load": rng_after_load,
                         "kernels": kernels}
    save_results(rank, out_dir, "reshard.pt", results)


def checkpoint_errors_suite(rank: int, world_size: int, model_path: Path, two_rank_out: Path, out_dir: Path) -> None:
    """Each load must raise CheckpointError; the messages are saved."""
    fixed = next(name for name in ENGINES if name not in engines_with(Capability.RESHARD))  # test_ddp
    cases = {
        "missing": ("fsdp2", out_dir / "no_such_checkpoint"),
        "other_engine": ("fsdp2", two_rank_out / "ckpt_fsdp"),
        "other_world_size": (fixed, two_rank_out / f"ckpt_{fixed}"),
    }
    results: dict[str, str] = {"fixed_engine": fixed}
    for label, (name, path) in cases.items():
        try:
            new_engine(engine_config(name), model_path).load_checkpoint(path)
            results[label] = "no error"
        except CheckpointError as error:
            results[label] = str(error)
    save_results(rank, out_dir, "checkpoint_errors.pt", results)


def killed_save(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """Save a checkpoint, train on, then die (SIGKILL) in the middle of overwriting it."""
    engine = new_engine(engine_config("fsdp2", micro_batch_size=2), model_path)
    train_steps(engine, [make_batch(60)], rank, world_size)
    engine.save_checkpoint(out_dir / "ckpt_killed")
    probe, _ = engine.forward_backward(make_batch(61), forward_only=True)
    torch.save(probe.batch["log_probs"], out_dir / "killed_probe.pt")
    train_steps(engine, [make_batch(62)], rank, world_size)
    real_save = dcp.save

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)  # shard files are on disk, the metadata and rename are not
        os.kill(os.getpid(), signal.SIGKILL)

    dcp.save = save_then_die
    engine.save_checkpoint(out_dir / "ckpt_killed")


def resume_after_kill(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    engine = new_engine(engine_config("fsdp2", micro_batch_size=2), model_path)
    engine.load_checkpoint(out_dir / "ckpt_killed")
    probe, _ = engine.forward_backward(make_batch(61), forward_only=True)
    save_results(rank, out_dir, "resumed_probe.pt", {"log_probs": probe.batch["log_probs"]})
