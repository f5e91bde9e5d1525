"""Atomic, layout-checked engine checkpoints.

Layout of a checkpoint folder ``path``:

* ``model_optim/``: model and optimizer state as a sharded torch.distributed.checkpoint;
* ``rng_rank{r}.pt``: each rank's python/numpy/torch RNG state;
* ``engine_meta.json``: engine name, model kind, world size, parallel layout, step
  counters and LR-schedule state. Written last: a folder without it is incomplete.

Everything is written into ``<path>.tmp`` and renamed to ``path`` only when all ranks
have finished, so a run killed mid-write leaves the previous ``path`` intact (if the
kill lands between the two renames of an overwrite, the previous checkpoint is at
``<path>.old`` and loading finds it there). All ranks must see the same file system.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from rlflow.errors import CheckpointError
from rlflow.utils.logging import get_logger
from rlflow.utils.seed import get_rng_state, set_rng_state

__all__ = [
    "META_FILE",
    "MODEL_OPTIM_DIR",
    "atomic_checkpoint_dir",
    "check_compatible",
    "load_rng",
    "read_meta",
    "resolve_checkpoint_dir",
    "save_rng",
    "write_meta",
]

META_FILE = "engine_meta.json"
MODEL_OPTIM_DIR = "model_optim"
_logger = get_logger(__name__)


def _barrier(group: Optional[dist.ProcessGroup]) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def _is_rank0(group: Optional[dist.ProcessGroup]) -> bool:
    return not dist.is_initialized() or dist.get_rank(group) == 0


@contextmanager
def atomic_checkpoint_dir(path: str | Path, group: Optional[dist.ProcessGroup]) -> Iterator[Path]:
    """Yield a temp folder to write into; on clean exit every rank is done and it becomes ``path``."""
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    if _is_rank0(group):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    yield tmp
    _barrier(group)
    if _is_rank0(group):
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    _barrier(group)


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """The complete checkpoint folder for ``path`` (or its ``.old`` twin); CheckpointError if none."""
    final = Path(path)
    if (final / META_FILE).is_file():
        return final
    old = final.with_name(final.name + ".old")
    if (old / META_FILE).is_file():
        _logger.warning("checkpoint %s is missing; using the previous one left at %s by an interrupted save", final, old)
        return old
    what = "does not exist" if not final.exists() else f"is incomplete (no {META_FILE}; the save was interrupted?)"
    raise CheckpointError(f"no engine checkpoint at {final}: the folder {what}")


def write_meta(folder: Path, meta: dict[str, Any], group: Optional[dist.ProcessGroup]) -> None:
    """Rank 0 writes ``engine_meta.json`` (call after every other file is written)."""
    _barrier(group)
    if _is_rank0(group):
        (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / META_FILE).read_text())


def check_compatible(saved: dict[str, Any], current: dict[str, Any], folder: Path) -> None:
    """Raise CheckpointError listing each of engine/model_kind/world_size/layout that differs."""
    keys = ("engine", "model_kind", "world_size", "layout")
    differences = [f"{key}: checkpoint {saved.get(key)!r} vs this engine {current[key]!r}" for key in keys if saved.get(key) != current[key]]
    if differences:
        raise CheckpointError(
            f"checkpoint {folder} was written under a different setup; resume with the same one. Differs: "
            + "; ".join(differences)
        )


def save_rng(folder: Path, rank: int) -> None:
    torch.save(get_rng_state(), folder / f"rng_rank{rank}.pt")


def load_rng(folder: Path, rank: int) -> None:
    file = folder / f"rng_rank{rank}.pt"
    if not file.is_file():
        raise CheckpointError(f"checkpoint {folder} has no RNG state for rank {rank} ({file.name})")
    set_rng_state(torch.load(file, weights_only=False))
