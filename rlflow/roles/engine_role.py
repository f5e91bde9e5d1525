"""``EngineRole``: a worker that hosts one engine, plus the checkpoint and export methods every such role shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from rlflow.engines.base import BaseEngine
from rlflow.engines.registry import build_engine
from rlflow.meta_info import COMPUTE_ENTROPY, TEMPERATURE
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch, response_length, response_slice
from rlflow.workers import ONE_TO_ALL, Worker, register


def build_initialized_engine(engine_config: Any, model_path: str | Path, model_kind: str = "causal_lm") -> BaseEngine:
    """Build the engine named by ``engine_config.name`` and load its model."""
    engine = build_engine(engine_config, model_path=model_path, model_kind=model_kind)
    engine.initialize()
    return engine


def forward_only(engine: BaseEngine, view: DataProto) -> Optional[DataProto]:
    """The engine's per-token outputs for ``view`` without gradients (dropout off).

    ``None`` on a rank that is not a collect rank of its engine (``mesh.is_collect``): such a
    rank (a non-last pipeline stage, a tensor-parallel rank other than 0) has no outputs, and
    mesh dispatch reads results only from collect ranks, so the role returns an empty batch there.
    A ``view`` of 0 rows never reaches the engine, which refuses one: dispatch hands a rank no rows
    only when the whole batch is empty, so every rank skips the call together, and the outputs
    are those of the contract with 0 rows (``no_row_outputs``).
    """
    if len(view) == 0:
        outputs = no_row_outputs(engine, view)
    else:
        with engine.eval_mode(), torch.no_grad():
            outputs, _ = engine.forward_backward(view, forward_only=True)
    return outputs if engine.mesh.is_collect else None


def no_row_outputs(engine: BaseEngine, view: DataProto) -> DataProto:
    """The per-token outputs ``engine.forward_backward`` gives for ``view``, for a ``view`` of 0 rows:
    ``values`` of a value model, else ``log_probs`` (and ``entropy`` when ``compute_entropy``), each ``[0, T]``."""
    if engine.model_kind == "value":
        keys = ["values"]
    else:
        keys = ["log_probs", "entropy"] if COMPUTE_ENTROPY.read(view.meta_info) else ["log_probs"]
    return DataProto.from_dict({key: torch.zeros(0, view.batch["input_ids"].shape[1]) for key in keys})


def require_rows(data: DataProto, method: str) -> None:
    """Raise one line when ``data`` has no rows: a training call then has no loss to take the gradient of."""
    if len(data) == 0:
        raise ValueError(f"{method} got an empty batch (0 rows): there is no loss to train on; send at least one row")


def response_log_probs(engine: BaseEngine, data: DataProto, temperature: float, with_entropy: bool) -> Optional[DataProto]:
    """Forward-only log-probs (and entropy) of the response tokens: ``log_probs``/``entropy`` ``[B, R]``
    (``None`` on ranks that are not collect ranks)."""
    view = engine_batch(data)
    view.meta_info = {TEMPERATURE.name: temperature, COMPUTE_ENTROPY.name: with_entropy}
    outputs = forward_only(engine, view)
    return None if outputs is None else response_columns(outputs, data)


def response_columns(outputs: DataProto, data: DataProto) -> DataProto:
    """The response columns ``[B, R]`` of an engine's per-token ``outputs`` ``[B, T]`` for the RL batch ``data``."""
    length = response_length(data)
    return DataProto.from_dict({key: response_slice(value, length) for key, value in outputs.batch.items()})


def renamed_or_empty(outputs: Optional[DataProto], old_keys: list[str], new_keys: list[str]) -> DataProto:
    """``outputs`` with its keys renamed, or an empty batch on a rank that collects nothing."""
    return DataProto() if outputs is None else outputs.rename(old_keys, new_keys)


class EngineRole(Worker):
    """A worker hosting one engine, registered in the mesh ``mesh_name`` with the engine's DP layout."""

    model_kind = "causal_lm"

    def __init__(self, engine_config: Any, model_path: str | Path, mesh_name: str):
        super().__init__()
        self.engine = build_initialized_engine(engine_config, model_path, self.model_kind)
        mesh = self.engine.mesh
        self.register_mesh(mesh_name, mesh.dp_rank, mesh.dp_size, mesh.is_collect)

    @register(dispatch_mode=ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the engine's resumable checkpoint (collective)."""
        self.engine.save_checkpoint(path)

    @register(dispatch_mode=ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore the engine from ``path`` (collective)."""
        self.engine.load_checkpoint(path)

    @register(dispatch_mode=ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        """Export the model as an HF folder (rank 0 writes; collective). With LoRA: the merged model."""
        self.engine.save_hf(path)

    @register(dispatch_mode=ONE_TO_ALL)
    def save_lora_adapter(self, path: str) -> None:
        """Export the LoRA adapters as a peft adapter folder (rank 0 writes; collective)."""
        self.engine.save_lora_adapter(path)
