"""Checks and loaders for local Hugging Face checkpoint folders (never the hub).

Every loader here passes ``local_files_only=True`` and first checks the folder itself, so a
wrong path fails with a message that names the missing folder or file instead of a hub lookup, and
a damaged ``config.json`` or tokenizer file with one naming the file and the offset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlflow.errors import UserError
from rlflow.utils.registry import unknown_name_message
from rlflow.utils.text_files import read_json

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_JSON_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.json")


class ModelFileError(UserError, ValueError):
    """A file of a model or tokenizer folder is damaged or cannot be loaded; the message names it."""


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a name (``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``) or a dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(unknown_name_message("dtype", str(name), DTYPES))
    return DTYPES[key]


def require_folder(path: str | Path, what: str) -> Path:
    """``path`` as a Path if it is an existing directory, else FileNotFoundError saying what was expected."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{what} folder {str(folder)!r} does not exist or is not a directory; rlflow loads local Hugging Face "
            "folders only (build an embedded preset with `python -m rlflow.data.presets --out DIR`)"
        )
    return folder


def require_model_folder(path: str | Path) -> Path:
    """Check that ``path`` holds config.json and model weights; FileNotFoundError names what is missing."""
    folder = require_folder(path, "model")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json")
    if not isinstance(read_json(folder / "config.json", ModelFileError), dict):
        raise ModelFileError(f"{folder / 'config.json'}: holds no JSON object")
    if (folder / "generation_config.json").is_file():
        read_json(folder / "generation_config.json", ModelFileError)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise FileNotFoundError(f"model folder {str(folder)!r} has no weights (expected one of {list(WEIGHT_FILES)})")
    return folder


def require_tokenizer_folder(path: str | Path) -> Path:
    """Check that ``path`` holds tokenizer files; FileNotFoundError names what is missing."""
    folder = require_folder(path, "tokenizer")
    if not (folder / "tokenizer_config.json").is_file() and not any((folder / n).is_file() for n in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"tokenizer folder {str(folder)!r} has no tokenizer files (expected tokenizer_config.json and one of "
            f"{list(TOKENIZER_FILES)})"
        )
    for name in _JSON_TOKENIZER_FILES:
        if (folder / name).is_file():
            read_json(folder / name, ModelFileError)
    return folder


def load_causal_lm(
    path: str | Path, dtype: str | torch.dtype = "float32", attn_implementation: str = "sdpa", **kwargs: Any
) -> PreTrainedModel:
    """An ``AutoModelForCausalLM`` from a local folder, in ``dtype``, with the given attention implementation."""
    return load_pretrained(AutoModelForCausalLM, path, dtype, attn_implementation, **kwargs)


def load_pretrained(
    auto_cls: type, path: str | Path, dtype: str | torch.dtype, attn_implementation: str, **kwargs: Any
) -> PreTrainedModel:
    """``auto_cls.from_pretrained`` on a checked local folder, in ``dtype``; load errors become ValueError naming it."""
    folder = require_model_folder(path)
    try:
        return auto_cls.from_pretrained(
            folder,
            dtype=resolve_dtype(dtype),
            attn_implementation=attn_implementation,
            local_files_only=True,
            **kwargs,
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelFileError(f"could not load a model from {str(folder)!r} with {auto_cls.__name__}: {error_summary(err)}") from err


def error_summary(error: BaseException) -> str:
    """The first line of a loader's exception message (or its type's name): what a one-line error quotes."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def safetensors_weight_map(index: Path) -> dict[str, str]:
    """``weight_map`` of a safetensors index (tensor name -> shard file); ``ModelFileError`` naming the file if it
    has none."""
    content = read_json(index, ModelFileError)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        raise ModelFileError(f"{index}: has no weight_map object")
    return weight_map


def safetensors_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every weight in a local folder's safetensors files, one tensor at a time
    (``model.safetensors``, or the shards an index lists); FileNotFoundError when the folder has neither."""
    from safetensors import safe_open

    folder = require_model_folder(path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(safetensors_weight_map(index).values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"model folder {str(folder)!r} has no safetensors weights")
    for file in files:
        with safe_open(str(folder / file), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
