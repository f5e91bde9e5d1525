"""``Reference``: the frozen reference policy, forward only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.engines.base import BaseEngine
from rlflow.meta_info import TEMPERATURE
from rlflow.protocol import DataProto
from rlflow.roles.engine_role import EngineRole, renamed_or_empty, response_log_probs
from rlflow.workers import DP_COMPUTE, register

REF_MESH = "ref"


def ref_log_probs(engine: BaseEngine, data: DataProto) -> DataProto:
    """``ref_log_prob`` ``[B, R]`` of the responses under ``engine`` as it is (empty on non-collect ranks)."""
    out = response_log_probs(engine, data, TEMPERATURE.read(data.meta_info), with_entropy=False)
    return renamed_or_empty(out, ["log_probs"], ["ref_log_prob"])


class Reference(EngineRole):
    """Hosts the reference engine; ``compute_ref_log_prob`` gives ``ref_log_prob`` ``[B, R]``."""

    def __init__(self, ref_config: Any, model_path: str | Path):
        super().__init__(ref_config.engine, model_path, REF_MESH)

    @register(dispatch_mode=DP_COMPUTE, mesh=REF_MESH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return ref_log_probs(self.engine, data)
