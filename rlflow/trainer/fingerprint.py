"""The fingerprint of a run's math: every config key that changes what is trained, plus the data's identity.

Each checkpoint keeps the fingerprint of the run that wrote it (``fingerprint.json`` beside the
driver state). ``trainer.resume_mode=auto`` refuses to resume a checkpoint whose fingerprint
differs, naming the keys; ``trainer.resume_mode=force`` resumes anyway (with a warning).

Every key counts as math unless it matches a pattern of ``FREE_KEYS`` (``fnmatch`` on the dotted
key), so a key added to the schema later is protected by default. The free keys are the ones
that change how long, where, how fast or how loudly a run goes, not what it computes: run
length (and the LR-schedule length derived from it), names, loggers, timeouts, frequencies, cluster shape and placement, output paths,
validation, rollout sizing, and memory/throughput knobs of the engines (micro-batching,
offload, recomputation). The training data files count twice: their paths (config keys) and
their content (``DATA_CONTENT_KEY``: size plus a SHA-256 of each file up to ``HASH_LIMIT`` bytes,
size plus mtime above).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from rlflow.data.files import resolve_files
from rlflow.errors import CheckpointError
from rlflow.utils.text_files import read_json

FINGERPRINT_FILE = "fingerprint.json"
DATA_CONTENT_KEY = "data.train_files (content)"
HASH_LIMIT = 256 * 1024**2

# Engine keys under every engine mount that tune memory or speed, not the math (and the schedule
# length, which follows the run length: 0 is filled in from the total steps).
_ENGINE_FREE = ("lr_scheduler.total_steps", "device", "param_offload", "optimizer_offload", "gradient_checkpointing", "micro_batch_size",
                "use_dynamic_bsz", "max_token_len_per_micro_batch", "use_remove_padding", "logprob_chunk_size",
                "defer_grad_reduce", "forward_micro_batch_size", "forward_use_dynamic_bsz", "forward_max_token_len_per_micro_batch")

FREE_KEYS: tuple[str, ...] = (
    # names, trackers, outputs and resume settings
    "trainer.project_name", "trainer.experiment_name", "trainer.logger", "trainer.default_local_dir",
    "trainer.resume_mode", "trainer.resume_from_path", "trainer.max_ckpt_to_keep", "trainer.export_hf_dir", "trainer.export_lora_adapter_dir",
    "trainer.plugins", "trainer.external_lib",
    # run length and frequencies
    "trainer.total_epochs", "trainer.total_training_steps", "trainer.test_freq", "trainer.val_before_train",
    "trainer.save_freq",
    # cluster shape, placement, launcher
    "trainer.device", "trainer.nnodes", "trainer.n_procs_per_node", "trainer.cpus_per_proc", "trainer.placement",
    "trainer.launcher", "trainer.ray_*",
    # timeouts, wherever they live
    "*timeout*",
    # validation
    "data.val_files", "data.val_batch_size", "rollout.val_kwargs.*",
    # how scoring and generation are sized and scheduled
    "reward.num_workers", "rollout.max_num_seqs", "rollout.gpu_memory_utilization", "rollout.kv_cache_space_gb",
    "rollout.free_cache_engine", "rollout.enforce_eager", "rollout.enable_prefix_caching",
    "rollout.weight_sync_bucket_mb", "rollout.num_replicas", "rollout.tensor_parallel_size",
    "model.trust_remote_code", "rollout.trust_remote_code",
    # the divergence guard's limits (when to stop a run, not what it computes)
    "reward.max_error_fraction", "trainer.max_consecutive_skipped_steps",
    # the switch that lets a slow CPU dtype run (the dtypes themselves change the math)
    "trainer.allow_slow_half_precision",
    *(f"{mount}engine.{key}" for mount in ("", "*.") for key in (*_ENGINE_FREE, "trust_remote_code")),
)


def is_free(key: str) -> bool:
    """True when ``key`` (dotted) may differ between a checkpoint and the run resuming it."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in FREE_KEYS)


def _flatten(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def _file_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    identity: dict[str, Any] = {"name": path.name, "size": stat.st_size}
    if stat.st_size <= HASH_LIMIT:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        identity["sha256"] = digest.hexdigest()
    else:
        identity["mtime_ns"] = stat.st_mtime_ns
    return identity


def run_fingerprint(config: DictConfig) -> dict[str, Any]:
    """``{dotted key: value}`` of every math key of ``config``, plus the training data's content identity."""
    plain = OmegaConf.to_container(config, resolve=True)
    fingerprint = {key: value for key, value in _flatten(plain) if not is_free(key)}
    train_files = OmegaConf.select(config, "data.train_files")
    if train_files:
        fingerprint[DATA_CONTENT_KEY] = [_file_identity(path) for path in resolve_files(list(train_files))]
    return json.loads(json.dumps(fingerprint, default=str))  # the form it has after a round trip through the file


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key (checkpoint -> now)`` for each math key that differs; keys that became free are ignored."""
    def shown(mapping: dict[str, Any], key: str) -> str:
        return repr(mapping[key]) if key in mapping else "<absent>"

    return [
        f"{key} ({shown(saved, key)} -> {shown(current, key)})"
        for key in sorted(set(saved) | set(current))
        if not is_free(key) and (key not in saved or key not in current or saved[key] != current[key])
    ]


def write_fingerprint(folder: Path, fingerprint: dict[str, Any]) -> Path:
    path = folder / FINGERPRINT_FILE
    path.write_text(json.dumps(fingerprint, indent=1, sort_keys=True) + "\n")
    return path


def read_fingerprint(folder: Path) -> dict[str, Any] | None:
    """The fingerprint a checkpoint was written with (None for a checkpoint older than fingerprints)."""
    path = folder / FINGERPRINT_FILE
    return read_json(path, CheckpointError, "checkpoint file") if path.is_file() else None
