"""Rollout: generation backends (vLLM, HF) behind ``BaseRollout``, weight sync from the trainer, mismatch metrics.

``build_rollout(config, model_path, device)`` picks the backend registered under ``config.name``.
Importing this package registers both backends; vLLM itself is imported only when a vLLM
rollout is built. See docs/rollout.md.
"""

from rlflow.rollout import hf_rollout, vllm_rollout  # noqa: F401  (register the backends)
from rlflow.rollout.base import ROLLOUT_REGISTRY, BaseRollout, build_rollout, check_tensor_parallel_size, rollout_names
from rlflow.rollout.lora_adapter import LORA_SYNC_MODES, syncs_adapters
from rlflow.rollout.metrics import rollout_mismatch_metrics
from rlflow.rollout.processing import PromptTooLongError
from rlflow.rollout.sampling import Sampling, resolve_sampling
from rlflow.rollout.weight_sync import WeightSyncError, iter_buckets, publish_weights, stream_published_weights

__all__ = [
    "LORA_SYNC_MODES",
    "ROLLOUT_REGISTRY",
    "BaseRollout",
    "PromptTooLongError",
    "Sampling",
    "WeightSyncError",
    "build_rollout",
    "check_tensor_parallel_size",
    "iter_buckets",
    "publish_weights",
    "resolve_sampling",
    "rollout_mismatch_metrics",
    "rollout_names",
    "stream_published_weights",
    "syncs_adapters",
]
