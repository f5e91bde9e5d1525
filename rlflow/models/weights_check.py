"""Model weights checked before any worker loads them: safetensors headers, file sizes, shapes against the config.

A truncated ``model.safetensors`` (a partial download or copy) used to be found only when a worker
loaded it after Ray started. ``check_safetensors_files`` reads each file's header alone (8 bytes of
length, then JSON) and checks that every tensor's bytes match its dtype and shape and lie inside the
file; ``check_weights_fit_config`` builds the model of ``config.json`` on the meta device (no
memory) and compares the shape of each tensor both name. Every failure is one ``ModelFileError``
line naming the file and the tensor or byte offset. ``pytorch_model.bin`` folders are not read here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlflow.models.hf_checkpoint import ModelFileError, error_summary, safetensors_weight_map
from rlflow.utils.text_files import decode_utf8, parse_json

_HEADER_LENGTH_BYTES = 8
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
                "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"

Shapes = dict[str, list[int]]


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder: the shards its index lists, or ``model.safetensors``; none for .bin."""
    if (folder / _INDEX).is_file():
        weight_map = safetensors_weight_map(folder / _INDEX)
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise ModelFileError(f"{folder / _INDEX}: lists {missing} but the folder has no such file(s)")
        return files
    return [folder / _SINGLE] if (folder / _SINGLE).is_file() else []


def read_safetensors_header(path: Path) -> Shapes:
    """``{tensor name: shape}`` of a safetensors file, after checking its header and every tensor's byte range."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        length_bytes = handle.read(_HEADER_LENGTH_BYTES)
        if len(length_bytes) < _HEADER_LENGTH_BYTES:
            raise ModelFileError(f"{path}: {size} bytes, too short for a safetensors header (cut short?)")
        length = int.from_bytes(length_bytes, "little")
        if _HEADER_LENGTH_BYTES + length > size:
            raise ModelFileError(f"{path}: its header says {length} bytes but the file has {size} in all (cut short?)")
        header = parse_json(decode_utf8(handle.read(length), path, ModelFileError, "safetensors header of"), path,
                            ModelFileError, "safetensors header of")
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the safetensors header holds no JSON object")
    data_start = _HEADER_LENGTH_BYTES + length
    return {name: _checked_entry(path, name, entry, data_start, size) for name, entry in header.items() if name != "__metadata__"}


def _checked_entry(path: Path, name: str, entry: Any, data_start: int, size: int) -> list[int]:
    try:
        dtype, shape, (begin, end) = entry["dtype"], [int(dim) for dim in entry["shape"]], entry["data_offsets"]
        itemsize = _DTYPE_BYTES[dtype]
    except (KeyError, TypeError, ValueError):
        raise ModelFileError(f"{path}: tensor {name!r} has a malformed header entry {entry!r:.120}") from None
    if end - begin != math.prod(shape) * itemsize:
        raise ModelFileError(f"{path}: tensor {name!r} ({dtype} {shape}) should take {math.prod(shape) * itemsize} bytes, "
                             f"its header gives {end - begin}")
    if data_start + end > size:
        raise ModelFileError(f"{path}: cut short at byte {size}: tensor {name!r} ends at byte {data_start + end} "
                             "(a partial download or copy?)")
    return shape


def check_safetensors_files(folder: Path) -> Shapes:
    """Check every safetensors file of ``folder`` (``read_safetensors_header``); ``{name: shape}`` of all of them."""
    shapes: Shapes = {}
    for path in safetensors_files(folder):
        shapes.update(read_safetensors_header(path))
    return shapes


def check_weights_fit_config(folder: Path, shapes: Shapes, trust_remote_code: bool = False) -> None:
    """Each tensor of ``shapes`` (from the folder's files) has the shape the causal LM of ``config.json`` gives it.

    A config that transformers cannot read is a ``ModelFileError``; one whose model it cannot build (an
    architecture of its own, a value model's head) is left to the load itself.
    """
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        raise ModelFileError(f"{folder / 'config.json'}: transformers cannot read it: {error_summary(error)}") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - not a causal LM transformers builds from its config: the load checks it
        return
    for name, tensor in model.state_dict().items():
        stored = shapes.get(name)
        if stored is not None and list(tensor.shape) != stored:
            raise ModelFileError(f"{folder}: tensor {name!r} has shape {stored} in the weight files but {list(tensor.shape)} "
                                 "for the model config.json describes; the weights and config.json do not belong together")
