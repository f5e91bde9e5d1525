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
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rlflow.config.validation import ConfigError
from rlflow.rollout.weight_sync import NamedTensors, tensor_nbytes
from rlflow.utils.text_files import read_json

SHARED_MEMORY_DIR = Path("/dev/shm")


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
    folder = tempfile.mkdtemp(prefix="rlflow-weights-", dir=_folder_with_room(sum(map(tensor_nbytes, tensors.values()))))
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

