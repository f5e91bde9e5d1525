"""``EngineRole``: a worker that hosts one engine, plus the checkpoint and export methods every such role shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlflow.engines.base import BaseEngine
from rlflow.engines.registry import build_engine
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch, response_length, response_slice
from rlflow.workers import ONE_TO_ALL, Worker, register


def build_initialized_engine(engine_config: Any, model_path: str | Path, model_kind: str = "causal_lm") -> BaseEngine:
    """Build the engine named by ``engine_config.name`` and load its model."""
    engine = build_engine(engine_config, model_path=model_path, model_kind=model_kind)
    engine.initialize()
    return engine


def response_log_probs(engine: BaseEngine, data: DataProto, temperature: float, with_entropy: bool) -> DataProto:
    """Forward-only log-probs (and entropy) of the response tokens: ``log_probs``/``entropy`` ``[B, R]``."""
    view = engine_batch(data)
    view.meta_info = {"temperature": temperature, "compute_entropy": with_entropy}
    with engine.eval_mode(), torch.no_grad():
        outputs, _ = engine.forward_backward(view, forward_only=True)
    length = response_length(data)
    return DataProto.from_dict({key: response_slice(value, length) for key, value in outputs.batch.items()})


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
        """Export the model as an HF folder (rank 0 writes; collective)."""
        self.engine.save_hf(path)
