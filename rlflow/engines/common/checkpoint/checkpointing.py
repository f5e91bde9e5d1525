"""Atomic, layout-checked engine checkpoints.

Layout of a checkpoint folder ``path``:

* the engine's model and optimizer state, in whatever format the engine writes
  (``model_optim/``: a sharded torch.distributed.checkpoint, for engines whose model is
  one torch module: ``save_module_state`` / ``load_module_state``);
* ``rng_rank{r}.pt``: each rank's python/numpy/torch RNG state;
* ``hf_config/``: the non-weight files of the model's source folder (config, tokenizer), so
  the checkpoint alone is enough to export it as an HF folder (``rlflow-export``);
* ``engine_meta.json``: engine name, model kind, world size, parallel layout, step
  counters and LR-schedule state. Written last: a folder without it is incomplete.

Resharding: an engine that passes ``reshard=True`` (it declares ``Capability.RESHARD``: its
state is a DCP checkpoint that DCP redistributes) loads a checkpoint written at another world
size; engine, model kind and layout must still match. RNG rule on a world-size change: rank
``r`` restores ``rng_rank{r}.pt`` when the checkpoint has it, and a rank the checkpoint did not
have reseeds from ``seed + r`` (the engine's seed, as at initialisation); the streams of ranks
that no longer exist are dropped.

``EngineCheckpointer`` is everything except the model/optimizer state, for any engine:
the atomic folder, the RNG files, the meta with the ``OptimizerStepper`` state, and the
setup check on load.

Everything is written into ``<path>.tmp`` and renamed to ``path`` only when all ranks
have finished (and its files and folders are fsynced), so a run killed mid-write, or a
power cut, leaves the previous ``path`` intact (if the
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
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from rlflow.engines.common.forward.models import source_files_to_copy
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper
from rlflow.engines.common.optim.optimizers import clean_param_name
from rlflow.errors import CheckpointError
from rlflow.utils.durable import fsync_path, fsync_tree
from rlflow.utils.logging import get_logger
from rlflow.utils.safe_io import load_weights_only
from rlflow.utils.seed import get_rng_state, set_rng_state, set_seed
from rlflow.utils.text_files import read_json

__all__ = [
    "HF_CONFIG_DIR",
    "META_FILE",
    "MODEL_OPTIM_DIR",
    "EngineCheckpointer",
    "atomic_checkpoint_dir",
    "check_compatible",
    "load_module_state",
    "load_rng",
    "read_meta",
    "resolve_checkpoint_dir",
    "save_module_state",
    "save_model_files",
    "save_rng",
    "setup_meta",
    "write_meta",
]

META_FILE = "engine_meta.json"
MODEL_OPTIM_DIR = "model_optim"
HF_CONFIG_DIR = "hf_config"
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
        fsync_tree(tmp)  # every rank's files and the folder names are on disk before the rename publishes them
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_path(final.parent)
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
    """The engine metadata a checkpoint folder holds; ``CheckpointError`` naming the file if it is damaged."""
    meta = read_json(folder / META_FILE, CheckpointError, "checkpoint file")
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint file {folder / META_FILE}: holds no JSON object; the checkpoint is damaged")
    return meta


_SETUP_KEYS = ("engine", "model_kind", "world_size", "layout")


def setup_meta(engine: str, model_kind: str, world_size: int, layout: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint must have been written under to be loadable: engine, model kind, world size, layout."""
    return dict(zip(_SETUP_KEYS, (engine, model_kind, world_size, layout)))


def check_compatible(saved: dict[str, Any], current: dict[str, Any], folder: Path, reshard: bool = False) -> None:
    """Raise CheckpointError listing each of engine/model_kind/world_size/layout that differs
    (``reshard``: the world size may differ)."""
    differences = [
        f"{key}: checkpoint {saved.get(key)!r} vs this engine {current[key]!r}"
        for key in _SETUP_KEYS
        if saved.get(key) != current[key] and not (reshard and key == "world_size")
    ]
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
    set_rng_state(load_weights_only(file, CheckpointError))


def save_model_files(folder: Path, model_path: Path, group: Optional[dist.ProcessGroup]) -> None:
    """Rank 0 copies the model's config and tokenizer files (no weights) into ``folder/hf_config``."""
    if _is_rank0(group):
        target = folder / HF_CONFIG_DIR
        target.mkdir()
        for file in source_files_to_copy(model_path):
            shutil.copy2(file, target / file.name)


class EngineCheckpointer:
    """The engine-independent part of ``save_checkpoint`` / ``load_checkpoint``.

    ``with checkpointer.save(path) as folder:`` the engine writes its model/optimizer
    state into ``folder``; on exit every rank's RNG state and then the meta (setup +
    optimizer-step state) are written and the folder is renamed into place.
    ``with checkpointer.load(path) as folder:`` checks the setup first (CheckpointError
    listing what differs), the engine reads its state, and on exit the RNG and the
    optimizer-step state are restored. Either way an optimizer that has not stepped yet
    is left with no state (``OptimizerStepper.forget_placeholder_state``).
    """

    def __init__(self, setup: dict[str, Any], stepper: OptimizerStepper, rank: int, group: Optional[dist.ProcessGroup],
                 reshard: bool = False, seed: int = 0) -> None:
        """``setup``: from ``setup_meta``; ``rank``: this process's rank in ``group`` (None: the default group);
        ``reshard``: load checkpoints of any world size (the engine's state loader reshards); ``seed``: the
        engine's seed, from which a rank the checkpoint did not have derives its RNG state."""
        self.setup, self.stepper, self.rank, self.group = setup, stepper, rank, group
        self.reshard, self.seed = reshard, seed

    @contextmanager
    def save(self, path: str | Path) -> Iterator[Path]:
        with atomic_checkpoint_dir(path, self.group) as folder:
            yield folder
            save_rng(folder, self.rank)
            write_meta(folder, {**self.setup, **self.stepper.state_dict()}, self.group)
        self.stepper.forget_placeholder_state()

    @contextmanager
    def load(self, path: str | Path) -> Iterator[Path]:
        folder = resolve_checkpoint_dir(path)
        meta = read_meta(folder)
        check_compatible(meta, self.setup, folder, self.reshard)
        yield folder
        if self.rank < meta["world_size"]:
            load_rng(folder, self.rank)
        else:
            _logger.info("checkpoint %s has no RNG state for rank %d (written at world size %d): seeding it from %d + rank",
                         folder, self.rank, meta["world_size"], self.seed)
            set_seed(self.seed + self.rank)
        self.stepper.load_state_dict(meta)
        self.stepper.forget_placeholder_state()


def save_module_state(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, group: Optional[dist.ProcessGroup],
                      trainable_only: bool = False, by_name: bool = False) -> None:
    """Model + optimizer state of a (DDP / FSDP / FSDP2-wrapped) module as a sharded DCP checkpoint
    (``trainable_only``: the parameters that train, e.g. LoRA adapters, and not the frozen base). ``by_name``:
    the optimizer's group settings keyed by parameter name, not by group index, for ranks that hold different
    parameters (pipeline stages: indexed groups of two stages would share one key and one value)."""
    options = StateDictOptions(flatten_optimizer_state_dict=by_name)
    model_state, optim_state = get_state_dict(module, optimizer, options=options)
    if trainable_only:
        model_state = _trainable_entries(model_state, module)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / MODEL_OPTIM_DIR), process_group=group)


def load_module_state(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, group: Optional[dist.ProcessGroup],
                      trainable_only: bool = False, by_name: bool = False) -> None:
    """Load what ``save_module_state`` wrote into ``module`` and ``optimizer`` (DCP reshards to this world size);
    with ``trainable_only`` the frozen parameters keep their current values; ``by_name`` as it was saved."""
    options = StateDictOptions(flatten_optimizer_state_dict=by_name)
    model_state, optim_state = get_state_dict(module, optimizer, options=options)
    state = {"model": _trainable_entries(model_state, module) if trainable_only else model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder / MODEL_OPTIM_DIR), process_group=group)
    model_state.update(state["model"])
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=state["optim"], options=options)


def _trainable_entries(model_state: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """The entries of a ``get_state_dict`` model state that belong to parameters with ``requires_grad``.

    Filtered by name, the same way for DDP, FSDP1 and FSDP2 state dicts (``StateDictOptions(ignore_frozen_params=True)``
    failed inside FSDP1's state-dict hooks when a unit held frozen parameters only)."""
    trainable = {clean_param_name(name) for name, param in module.named_parameters() if param.requires_grad}
    return {key: value for key, value in model_state.items() if key in trainable}
