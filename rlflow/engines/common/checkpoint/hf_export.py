"""Write exported ``(hf_name, tensor)`` pairs as a Hugging Face folder, a shard at a time.

Tensors are buffered up to ``shard_bytes`` and written as ``model-0000i-of-0000n``
safetensors files with an index (one ``model.safetensors`` when it fits in one shard).
The non-weight files of the source folder (config, tokenizer, chat template,
generation config) are copied; a ``model_config`` given replaces the copied ``config.json``
(a value model loaded from a causal-LM folder is written as its classification class). The
folder appears atomically. Every export holds
``rlflow_export.json`` (``EXPORT_MARKER``): an existing ``out_dir`` (or its ``.tmp`` twin) is
replaced only when it carries that marker, so a user's folder is never deleted.

``save_hf_from_export`` is ``BaseEngine.save_hf`` for any engine whose export is
collective: every rank iterates the export, rank 0 writes. ``write_peft_adapter_folder`` writes
a LoRA model's adapters as a peft adapter folder, with the same marker and atomic rename.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import PretrainedConfig

from rlflow.engines.common.forward.lora import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from rlflow.engines.common.forward.models import source_files_to_copy

__all__ = ["EXPORT_MARKER", "save_hf_from_export", "write_from_export", "write_hf_folder", "write_peft_adapter_folder"]

_SHARD_BYTES = 2 * 1024**3
EXPORT_MARKER = "rlflow_export.json"


def _remove_export(folder: Path) -> None:
    """Delete a previous (or half-written) rlflow export; refuse a folder rlflow did not write."""
    if not folder.exists():
        return
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        return
    if not (folder / EXPORT_MARKER).is_file():
        raise FileExistsError(f"{folder} exists and is not an rlflow export (no {EXPORT_MARKER}); not replacing it")
    shutil.rmtree(folder)


class _ShardWriter:
    """Buffers tensors and flushes numbered shards of one weights file family."""

    def __init__(self, folder: Path, stem: str, shard_bytes: int) -> None:
        self.folder, self.stem, self.shard_bytes = folder, stem, shard_bytes
        self.buffer: dict[str, torch.Tensor] = {}
        self.buffer_bytes = 0
        self.shards: list[str] = []
        self.weight_map: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.buffer and self.buffer_bytes + nbytes > self.shard_bytes:
            self.flush()
        self.buffer[name] = tensor.detach().to("cpu").contiguous()
        self.buffer_bytes += nbytes

    def flush(self) -> None:
        if not self.buffer:
            return
        temp_name = f".{self.stem}-part{len(self.shards)}.safetensors"
        save_file(self.buffer, str(self.folder / temp_name), metadata={"format": "pt"})
        self.shards.append(temp_name)
        self.weight_map.update({name: temp_name for name in self.buffer})
        self.buffer, self.buffer_bytes = {}, 0

    def finish(self) -> None:
        """Rename the parts to their final names; write an index when there are several."""
        self.flush()
        total = len(self.shards)
        if total == 1:
            os.replace(self.folder / self.shards[0], self.folder / f"{self.stem}.safetensors")
            return
        final_names = {part: f"{self.stem}-{i + 1:05d}-of-{total:05d}.safetensors" for i, part in enumerate(self.shards)}
        for part, final in final_names.items():
            os.replace(self.folder / part, self.folder / final)
        index = {"metadata": {}, "weight_map": {name: final_names[part] for name, part in sorted(self.weight_map.items())}}
        (self.folder / f"{self.stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_hf_folder(
    out_dir: str | Path,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    source_folder: Path,
    model_config: Optional[PretrainedConfig] = None,
    shard_bytes: int = _SHARD_BYTES,
) -> Path:
    """Write ``named_tensors`` plus the source folder's config/tokenizer files to ``out_dir`` atomically."""
    with _atomic_export(out_dir, "hf") as tmp:
        writer = _ShardWriter(tmp, "model", shard_bytes)
        for name, tensor in named_tensors:
            writer.add(name, tensor)
        writer.finish()
        for file in source_files_to_copy(source_folder):
            shutil.copy2(file, tmp / file.name)
        if model_config is not None:
            model_config.to_json_file(str(tmp / "config.json"))
    return Path(out_dir)


def write_peft_adapter_folder(out_dir: str | Path, named_tensors: Iterable[tuple[str, torch.Tensor]],
                              adapter_config_json: str) -> Path:
    """Write a peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) atomically;
    ``named_tensors`` carry peft's names (``lora_export.adapter_tensors``)."""
    with _atomic_export(out_dir, "peft") as tmp:
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG_FILE).write_text(adapter_config_json)
    return Path(out_dir)


@contextmanager
def _atomic_export(out_dir: str | Path, export_format: str) -> Iterator[Path]:
    """A fresh ``<out_dir>.tmp`` carrying the export marker, renamed to ``out_dir`` (replacing an earlier export) on exit."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    _remove_export(tmp)
    tmp.mkdir(parents=True)
    (tmp / EXPORT_MARKER).write_text(json.dumps({"format": export_format, "writer": "rlflow"}) + "\n")
    yield tmp
    _remove_export(out)
    os.replace(tmp, out)


def save_hf_from_export(
    out_dir: str | Path,
    exported: Iterable[tuple[str, torch.Tensor]],
    source_folder: Path,
    model_config: Optional[PretrainedConfig] = None,
    group: Optional[dist.ProcessGroup] = None,
) -> None:
    """Collective: every rank of ``group`` drains ``exported`` (its gathers are collective), rank 0 writes the folder."""
    write_from_export(exported, lambda tensors: write_hf_folder(out_dir, tensors, source_folder, model_config), group)


def write_from_export(
    exported: Iterable[tuple[str, torch.Tensor]],
    write: Callable[[Iterable[tuple[str, torch.Tensor]]], Path],
    group: Optional[dist.ProcessGroup] = None,
) -> None:
    """Collective: rank 0 of ``group`` passes ``exported`` to ``write``; the other ranks drain it (its gathers)."""
    if dist.get_rank(group) == 0:
        write(exported)
    else:
        for _ in exported:
            pass
    dist.barrier(group=group)
