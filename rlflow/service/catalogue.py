"""What the service serves and where it keeps things: the base models, and ``tinker://`` paths as folders.

Base models are the local HF folders of ``service.models`` (name -> folder). A client names one by
its name or by its folder's path (``tinker-cookbook`` sends the path it loads the tokenizer from).

Everything the service writes lives under ``service.checkpoint_dir``, one folder per training
client (``<session>_train_<n>``, the client's model id with ``:`` replaced), holding ``model.json``
(its base model and LoRA shape), ``weights/<name>`` (``save_state``: engine checkpoints) and
``sampler_weights/<name>`` (``save_weights_for_sampler``: peft adapter folders), each with a sidecar
``.<name>.json`` once it is published or given a time to live (``rlflow.service.checkpoint_store``). A Tinker path
``tinker://<model id>/<weights|sampler_weights>/<name>`` names such a folder.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from rlflow.errors import UserError
from rlflow.models.hf_checkpoint import require_model_folder
from rlflow.models.loading import load_tokenizer
from rlflow.rollout.processing import eos_token_ids
from rlflow.utils.text_files import FileFormatError, read_json

SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MODEL_RECORD = "model.json"


class UnknownModelError(UserError, KeyError):
    """A request names a base model, training client or path the service does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; this is a sentence
        return str(self.args[0])


class BadPathError(UserError, ValueError):
    """A checkpoint name or ``tinker://`` path is malformed."""


@dataclass(frozen=True)
class LoraShape:
    """The adapters of a training client: their rank and the parts they train (attention, mlp, unembedding); rank 0
    (no parts) is full fine-tuning, every weight trained."""

    rank: int
    parts: tuple[str, ...]

    @property
    def is_lora(self) -> bool:
        """Adapters (rank > 0), not full fine-tuning."""
        return self.rank > 0


@dataclass(frozen=True)
class BaseModel:
    """One served base model: its name, folder and the token facts the server needs."""

    name: str
    path: Path
    pad_token_id: int
    end_token_ids: frozenset[int]
    vocab_size: int  # rows of the model's embedding: token ids a request may hold are 0..vocab_size - 1


def load_base_models(models: Mapping[str, Any]) -> dict[str, BaseModel]:
    """``service.models`` as ``BaseModel``s (folders and tokenizers checked; FileNotFoundError names a bad one)."""
    catalogue = {}
    for name, folder in models.items():
        path = require_model_folder(str(folder)).resolve()
        tokenizer = load_tokenizer(path)
        catalogue[str(name)] = BaseModel(str(name), path, int(tokenizer.pad_token_id), eos_token_ids(path, tokenizer),
                                         model_vocab_size(path))
    return catalogue


def model_vocab_size(path: Path) -> int:
    """The ``vocab_size`` of an HF folder's ``config.json`` (its ``text_config``'s for a multimodal model)."""
    config = read_json(path / "config.json", what="the model's config")
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise FileFormatError(f"{path / 'config.json'} has no positive integer vocab_size")
    return size


def check_token_ids(tokens: list[int], vocab_size: int, what: str, error: type[Exception]) -> None:
    """``error`` naming the first of ``tokens`` outside the model's vocabulary (an embedding row it lacks)."""
    outside = next(((position, token) for position, token in enumerate(tokens) if not 0 <= int(token) < vocab_size), None)
    if outside is not None:
        raise error(f"{what}: token {outside[1]} at position {outside[0]} is outside the model's vocabulary "
                    f"0..{vocab_size - 1}")


def find_base_model(catalogue: dict[str, BaseModel], requested: str) -> BaseModel:
    """The base model ``requested`` names, by name or by its folder's path."""
    if requested in catalogue:
        return catalogue[requested]
    for model in catalogue.values():
        if Path(requested).expanduser().resolve() == model.path:
            return model
    raise UnknownModelError(f"base model {requested!r} is not served; serve it with service.models.<name>=<HF folder> "
                            f"(served: {sorted(catalogue)})")


def check_name(name: str) -> str:
    """A checkpoint name: letters, digits, ``.``, ``_``, ``-`` (no path separators)."""
    if not _NAME.match(name or ""):
        raise BadPathError(f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def is_expired(metadata: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's sidecar metadata (``CheckpointFolders.metadata``) says it has expired."""
    return metadata.get("expires_at") is not None and metadata["expires_at"] <= time.time()


class CheckpointFolders:
    """Maps training clients and ``tinker://`` paths to folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_dir(self, model_id: str) -> Path:
        return self.root / model_id.replace(":", "_")

    def path(self, model_id: str, kind: str, name: str) -> str:
        """The ``tinker://`` path of checkpoint ``name`` of ``kind`` (weights | sampler_weights)."""
        return f"{SCHEME}{model_id}/{kind}/{check_name(name)}"

    def folder(self, model_id: str, kind: str, name: str) -> Path:
        return self.model_dir(model_id) / kind / check_name(name)

    def resolve(self, path: str, kind: str, account: str) -> tuple[str, Path]:
        """``(model id, folder)`` of a ``tinker://<model id>/<kind>/<name>`` path of ``account``'s; the folder must
        exist (another account's path does not, to this one: ``UnknownModelError``)."""
        parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
        if len(parts) != 3 or parts[1] not in KINDS:
            raise BadPathError(f"{path!r} is not a tinker://<model id>/<weights|sampler_weights>/<name> path")
        model_id, found_kind, name = parts
        if found_kind != kind:
            raise BadPathError(f"{path!r} holds {found_kind}, and this request needs {kind}")
        folder = self.folder(model_id, kind, name)
        metadata = self.metadata(model_id, kind, name)
        readable = self.account_of(model_id) == account or metadata.get("public", False)
        if not folder.is_dir() or not readable or is_expired(metadata):
            raise UnknownModelError(f"{path!r} does not exist on this server")
        return model_id, folder

    def metadata_file(self, model_id: str, kind: str, name: str) -> Path:
        """The sidecar of checkpoint ``name``: ``.<name>.json`` beside its folder (a name never starts with ``.``)."""
        return self.model_dir(model_id) / kind / f".{check_name(name)}.json"

    def metadata(self, model_id: str, kind: str, name: str) -> dict[str, Any]:
        """A checkpoint's ``public`` flag and ``expires_at`` (epoch seconds or None); ``{}`` without a sidecar."""
        file = self.metadata_file(model_id, kind, name)
        record = read_json(file, FileFormatError, "checkpoint metadata") if file.is_file() else {}
        return record if isinstance(record, dict) else {}

    def write_record(self, model_id: str, base_model: str, shape: LoraShape, account: str) -> None:
        """Record a training client's base model, LoRA shape and account (read back to load its checkpoints)."""
        folder = self.model_dir(model_id)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"model_id": model_id, "base_model": base_model, "rank": shape.rank, "parts": list(shape.parts),
                  "account": account}
        (folder / MODEL_RECORD).write_text(json.dumps(record))

    def account_of(self, model_id: str) -> Optional[str]:
        """The account that created training client ``model_id`` (None: no record, or one written before accounts)."""
        file = self.model_dir(model_id) / MODEL_RECORD
        record = read_json(file, FileFormatError, "training client record") if file.is_file() else None
        return record.get("account") if isinstance(record, dict) else None

    def read_record(self, model_id: str) -> tuple[str, LoraShape]:
        """``(base model name, LoRA shape)`` of a training client this server created."""
        file = self.model_dir(model_id) / MODEL_RECORD
        if not file.is_file():
            raise UnknownModelError(f"training client {model_id!r} was not created on this server")
        record = read_json(file, FileFormatError, "training client record")
        try:
            return record["base_model"], LoraShape(int(record["rank"]), tuple(record["parts"]))
        except (KeyError, TypeError, ValueError):
            raise FileFormatError(f"training client record {file}: not the record this server writes "
                                  "(base_model, rank, parts); the file is damaged") from None
