"""The REST client's view of what the service stored: training runs, their checkpoints, deleting, publishing, TTLs.

Everything is read from ``service.checkpoint_dir`` on each call (``CheckpointFolders``), so a restarted service
lists what an earlier one saved. A training run is a training client's folder (its ``model.json``); its
checkpoints are the folders under ``weights/`` and ``sampler_weights/``. Each call acts for one account
(``rlflow.service.accounts``): its own runs and checkpoints only, and another account's are unknown (404).

* **Delete** removes the checkpoint's folder and sidecar, nothing else; a sampling session that samples from it
  fails its next load.
* **Publish** makes a checkpoint readable by every account (load it, sample from it; never delete or change it).
* **TTL** sets ``expires_at`` (3600 s to 10 years from now; ``None`` clears it); an expired checkpoint no longer
  resolves, and the next listing of its run's checkpoints deletes it.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from rlflow.errors import UserError
from rlflow.service.catalogue import KINDS, MODEL_RECORD, CheckpointFolders, UnknownModelError, is_expired
from rlflow.utils.durable import write_atomic
from rlflow.utils.logging import get_logger
from rlflow.utils.text_files import FileFormatError, read_json

logger = get_logger(__name__)

CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler"}  # folder kind -> the SDK's checkpoint_type
TTL_RANGE_S = (3600, 10 * 365 * 24 * 3600)


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat()


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint folder and what the SDK's ``Checkpoint`` says of it."""

    model_id: str
    kind: str
    name: str
    folder: Path
    metadata: dict[str, Any]
    mtime: float  # the folder's, read once when listed

    def as_json(self, folders: CheckpointFolders) -> dict[str, Any]:
        """The SDK's ``Checkpoint`` fields."""
        files = [file for file in self.folder.rglob("*") if file.is_file()]
        expires_at = self.metadata.get("expires_at")
        return {"checkpoint_id": f"{self.kind}/{self.name}", "checkpoint_type": CHECKPOINT_TYPES[self.kind],
                "time": _iso(self.mtime), "tinker_path": folders.path(self.model_id, self.kind, self.name),
                "size_bytes": sum(file.stat().st_size for file in files), "public": bool(self.metadata.get("public")),
                "expires_at": None if expires_at is None else _iso(expires_at)}


def check_ttl(ttl_seconds: Any) -> None:
    """Raise ``UserError`` unless ``ttl_seconds`` is None (never expires) or an integer in ``TTL_RANGE_S``."""
    if ttl_seconds is not None and not (isinstance(ttl_seconds, int) and TTL_RANGE_S[0] <= ttl_seconds <= TTL_RANGE_S[1]):
        raise UserError(f"ttl_seconds must be an integer from {TTL_RANGE_S[0]} (1 hour) to {TTL_RANGE_S[1]} "
                        f"(10 years), or null to remove the expiry; got {ttl_seconds!r}")


class CheckpointStore:
    """The REST operations over ``folders``, each for one account."""

    def __init__(self, folders: CheckpointFolders) -> None:
        self.folders = folders

    def run_ids(self, account: str) -> list[str]:
        """``account``'s training runs, the most recently used first."""
        files = sorted(self.folders.root.glob(f"*/{MODEL_RECORD}"), key=lambda file: file.stat().st_mtime, reverse=True)
        runs = []
        for file in files:
            try:
                record = read_json(file, FileFormatError, "training client record")
            except FileFormatError as error:
                logger.warning("training runs: skipping %s", error)
                continue
            if isinstance(record, dict) and record.get("account") == account and isinstance(record.get("model_id"), str):
                runs.append(record["model_id"])
        return runs

    def training_run(self, model_id: str, account: str) -> dict[str, Any]:
        """The SDK's ``TrainingRun`` of ``account``'s run ``model_id``."""
        self._owned(model_id, account)
        base_model, shape = self.folders.read_record(model_id)
        checkpoints = self.checkpoints(model_id, account)
        latest = {kind: max((c for c in checkpoints if c.kind == kind), key=lambda c: c.mtime, default=None) for kind in KINDS}
        record = self.folders.model_dir(model_id) / MODEL_RECORD
        last_used = max([record.stat().st_mtime] + [c.mtime for c in checkpoints])
        return {"training_run_id": model_id, "base_model": base_model, "model_owner": account, "is_lora": shape.is_lora,
                "lora_rank": shape.rank, "last_request_time": _iso(last_used),
                "last_checkpoint": latest["weights"] and latest["weights"].as_json(self.folders),
                "last_sampler_checkpoint": latest["sampler_weights"] and latest["sampler_weights"].as_json(self.folders)}

    def checkpoints(self, model_id: str, account: str) -> list[StoredCheckpoint]:
        """``account``'s run ``model_id``'s live checkpoints, training ones then sampler ones, each oldest first
        (expired ones are deleted on the way)."""
        self._owned(model_id, account)
        live = []
        for kind in KINDS:
            folder = self.folders.model_dir(model_id) / kind
            entries = [entry for entry in (folder.iterdir() if folder.is_dir() else [])
                       if entry.is_dir() and not entry.name.startswith(".")]
            listed = [StoredCheckpoint(model_id, kind, entry.name, entry, self.folders.metadata(model_id, kind, entry.name),
                                       entry.stat().st_mtime) for entry in entries]
            for checkpoint in sorted(listed, key=lambda checkpoint: checkpoint.mtime):
                if is_expired(checkpoint.metadata):
                    self._remove(checkpoint)
                else:
                    live.append(checkpoint)
        return live

    def delete(self, model_id: str, kind: str, name: str, account: str) -> None:
        """Remove checkpoint ``kind/name`` of ``account``'s run ``model_id``: its folder and sidecar only."""
        self._remove(self._checkpoint(model_id, kind, name, account))

    def set_public(self, model_id: str, kind: str, name: str, account: str, public: bool) -> None:
        """Publish (every account may read it) or unpublish one of ``account``'s checkpoints."""
        checkpoint = self._checkpoint(model_id, kind, name, account)
        self._write_metadata(checkpoint, {**checkpoint.metadata, "public": public})

    def set_ttl(self, model_id: str, kind: str, name: str, account: str, ttl_seconds: Optional[int]) -> None:
        """Expire one of ``account``'s checkpoints ``ttl_seconds`` from now (``TTL_RANGE_S``), or never (None)."""
        checkpoint = self._checkpoint(model_id, kind, name, account)
        check_ttl(ttl_seconds)
        expires_at = None if ttl_seconds is None else time.time() + ttl_seconds
        self._write_metadata(checkpoint, {**checkpoint.metadata, "expires_at": expires_at})

    # ------------------------------------------------------------------ helpers
    def _owned(self, model_id: str, account: str) -> None:
        if self.folders.account_of(model_id) != account:
            raise UnknownModelError(f"training run {model_id!r} does not exist on this server")

    def _checkpoint(self, model_id: str, kind: str, name: str, account: str) -> StoredCheckpoint:
        if kind not in KINDS:
            raise UnknownModelError(f"checkpoint {kind}/{name} of {model_id!r} does not exist (kinds: {', '.join(KINDS)})")
        for checkpoint in self.checkpoints(model_id, account):
            if (checkpoint.kind, checkpoint.name) == (kind, name):
                return checkpoint
        raise UnknownModelError(f"checkpoint {kind}/{name} of {model_id!r} does not exist on this server")

    def _write_metadata(self, checkpoint: StoredCheckpoint, metadata: dict[str, Any]) -> None:
        write_atomic(self.folders.metadata_file(checkpoint.model_id, checkpoint.kind, checkpoint.name), json.dumps(metadata))

    def _remove(self, checkpoint: StoredCheckpoint) -> None:
        shutil.rmtree(checkpoint.folder)
        self.folders.metadata_file(checkpoint.model_id, checkpoint.kind, checkpoint.name).unlink(missing_ok=True)
