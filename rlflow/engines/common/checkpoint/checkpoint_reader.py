"""Read an engine checkpoint's model weights on one process, without a process group.

``save_module_state`` writes ``{"model": state, "optim": state}`` as a sharded
torch.distributed.checkpoint (DCP) under ``model_optim/``; the model state is keyed by the
wrapped forward module's parameter names (``model.<hf name>``), whatever the engine's
sharding (FSDP1's sharded tensors, FSDP2's DTensors, DDP's replicas), because the engines save
through ``get_state_dict``. ``read_model_weights`` allocates each model tensor at its full
size from the checkpoint's metadata and lets DCP fill it from the shards of every rank (the
optimizer state is not read). The names stay the checkpoint's: the engine class that wrote it
turns them into HF names (``BaseEngine.checkpoint_hf_tensors``, the mapping its live export
uses). Memory: one copy of the model.
"""

from __future__ import annotations

import warnings
from pathlib import Path
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from rlflow.engines.common.checkpoint.checkpointing import MODEL_OPTIM_DIR
from rlflow.errors import CheckpointError

__all__ = ["read_model_weights"]

_MODEL_KEY = "model."  # DCP flattens {"model": {name: tensor}} into "model.<name>"


def _first_line(error: BaseException) -> str:
    if isinstance(error, CheckpointException) and error.failures:  # the read error it wraps
        error = next(iter(error.failures.values()))[0]
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def read_model_weights(folder: Path) -> list[tuple[str, torch.Tensor]]:
    """``(state name, full tensor)`` of every model weight in the engine checkpoint ``folder``, in saved order.

    Raises ``CheckpointError`` (one line) when ``model_optim/`` is missing, holds no model state,
    or a shard cannot be read.
    """
    state_dir = folder / MODEL_OPTIM_DIR
    if not (state_dir / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {folder} has no readable model state ({MODEL_OPTIM_DIR}/.metadata is missing)")
    reader = FileSystemReader(str(state_dir))
    try:
        metadata = reader.read_metadata()
    except Exception as error:  # unpickling a damaged metadata file: any error type
        raise CheckpointError(f"checkpoint {folder}: {MODEL_OPTIM_DIR}/.metadata is corrupt ({_first_line(error)})") from None
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(_MODEL_KEY) and isinstance(meta, TensorStorageMetadata)
    }
    if not state:
        raise CheckpointError(f"checkpoint {folder}: {MODEL_OPTIM_DIR} holds no model weights (not an engine checkpoint?)")
    try:
        with warnings.catch_warnings():  # one process on purpose: no "assuming a single process" warning
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as error:  # a bad shard: a CheckpointException (a BaseException) wrapping it
        raise CheckpointError(
            f"checkpoint {folder}: the model state in {MODEL_OPTIM_DIR}/ cannot be read ({_first_line(error)}); "
            f"the checkpoint is damaged, export an earlier one"
        ) from None
    return [(key.removeprefix(_MODEL_KEY), tensor) for key, tensor in state.items()]
