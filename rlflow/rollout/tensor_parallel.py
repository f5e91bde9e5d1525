"""A rollout engine split over tensor-parallel processes: which sizes run, and how weights reach every shard.

``rollout.tensor_parallel_size`` > 1 runs vLLM's multiprocess executor inside the rollout worker: the engine's
scheduler stays in the worker's process (the request level and partial rollouts are unchanged) and each
tensor-parallel shard of the model runs in a process of its own, on a device (GPU) or cores (CPU) the
rollout worker reserved for it (a split rollout pool reserves ``tensor_parallel_size`` of each per worker).

* **Which sizes run** (``check_tensor_parallel_model``): the backend must run tensor parallelism
  (``BaseRollout.runs_tensor_parallel``), and the model's attention heads must split over the ranks (vLLM's
  rule: the query heads divide by the size; the key/value heads divide by it or it by them, each rank then
  holding a copy). Checked before Ray, on the model folder's ``config.json``.
* **Weights** (``shared_weights_file``): the synced tensors are full HF-named tensors from any trainer layout;
  each shard's loader (``reload_weights``) takes its slice of them. They are written once as a safetensors
  file in shared memory (``/dev/shm`` when it has room, else the temporary folder), every shard process reads
  that one file and reloads from it, and the file is removed. One write, no copy per shard through a pipe.
  A process killed in the middle of a sync cannot remove its file; the next sync on the machine removes
  such leftovers (``remove_abandoned_sync_folders``): only rlflow's own folders, named with the pid that wrote
  them, when no process has that pid and the folder is over an hour old.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rlflow.config.validation import ConfigError
from rlflow.rollout.weight_sync import NamedTensors, tensor_nbytes
from rlflow.utils.text_files import read_json

SHARED_MEMORY_DIR = Path("/dev/shm")
SYNC_FOLDER_PREFIX = "rlflow-weights-"  # + the writing process's pid + "-" + mkdtemp's suffix
ABANDONED_AFTER_S = 3600.0  # a sync's file lives seconds; a folder this old whose writer is gone was abandoned


def check_tensor_parallel_model(size: int, model_path: str | Path) -> None:
    """One ``ConfigError`` line when the model's attention heads cannot be split over ``size`` ranks."""
    if size == 1:
        return
    config = read_json(Path(model_path) / "config.json", ConfigError)
    config = config.get("text_config", config)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    if heads % size or (kv_heads % size and size % kv_heads):
        raise ConfigError(
            f"config key 'rollout.tensor_parallel_size': {size} ranks cannot split the model's {heads} attention heads "
            f"and {kv_heads} key/value heads (the heads must divide by the size, the key/value heads by it or it by "
            f"them); choose a size that does")


def reload_from_file(worker: Any, path: str) -> int:
    """Run in each shard process (``LLM.collective_rpc``): reload the engine's weights in place from the
    safetensors file at ``path``, a tensor at a time; returns the number of tensors."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        names = list(handle.keys())
        worker.reload_weights(weights_iterator=((name, handle.get_tensor(name)) for name in names))
    return len(names)


@contextmanager
def shared_weights_file(named_tensors: NamedTensors) -> Iterator[str]:
    """The path of a safetensors file holding one weight sync, in shared memory when it has room; the file is
    removed when the block ends, however it ends."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
    parent = _folder_with_room(sum(map(tensor_nbytes, tensors.values())))
    remove_abandoned_sync_folders(Path(parent or tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=f"{SYNC_FOLDER_PREFIX}{os.getpid()}-", dir=parent)
    try:
        path = os.path.join(folder, "weights.safetensors")
        save_file(tensors, path)
        tensors.clear()  # the file holds them now
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _folder_with_room(nbytes: int) -> str | None:
    """``/dev/shm`` if it can hold ``nbytes`` with a quarter to spare, else None (the temporary folder)."""
    try:
        free = shutil.disk_usage(SHARED_MEMORY_DIR).free
    except OSError:
        return None
    return str(SHARED_MEMORY_DIR) if free > nbytes * 1.25 else None


def remove_abandoned_sync_folders(parent: Path) -> list[str]:
    """Remove the sync folders in ``parent`` that a killed process left (named with a pid no process has,
    untouched for ``ABANDONED_AFTER_S``); the names removed. The age guards a live writer in another pid
    namespace sharing the folder; anything not named as rlflow names its sync folders is never touched."""
    removed = []
    for entry in _entries(parent):
        pid = _writer_pid(entry.name)
        if pid is None or _process_exists(pid) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
        except OSError:
            continue  # gone meanwhile
    return removed


def _entries(parent: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(parent) as entries:
            return list(entries)
    except OSError:
        return []


def _writer_pid(name: str) -> int | None:
    """The pid in a sync folder's name, or None for any other name."""
    if not name.startswith(SYNC_FOLDER_PREFIX):
        return None
    pid, _, suffix = name[len(SYNC_FOLDER_PREFIX):].partition("-")
    return int(pid) if pid.isdigit() and suffix else None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
