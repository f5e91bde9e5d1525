"""Loaders for local Hugging Face folders: the one place engines, rollouts and roles load models from.

- ``load_causal_lm(path, dtype, attn_implementation)``: an ``AutoModelForCausalLM``;
- ``load_value_model(path, dtype, attn_implementation)``: an HF sequence- or token-classification model
  with one label (critic, reward model; ``rlflow.models.value_models``);
- ``load_tokenizer(path, trust_remote_code)``: an ``AutoTokenizer`` with a pad token guaranteed;
- ``resolve_dtype(name)``: ``"bf16"`` -> ``torch.bfloat16`` and friends.

Every loader takes ``trust_remote_code`` (default False; the runs pass ``model.trust_remote_code``
through the engine and rollout configs) and hands it to transformers' ``from_pretrained``.
Nothing is looked up on the hub (``local_files_only=True``); a missing folder or file raises
FileNotFoundError naming it, and an unreadable one ValueError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlflow.models.hf_checkpoint import (
    DTYPES,
    ModelFileError,
    error_summary,
    load_causal_lm,
    require_model_folder,
    require_tokenizer_folder,
    resolve_dtype,
)
from rlflow.models.value_models import load_value_model

__all__ = [
    "DTYPES",
    "load_causal_lm",
    "load_tokenizer",
    "load_value_model",
    "require_model_folder",
    "resolve_dtype",
]


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, **kwargs: Any) -> PreTrainedTokenizerBase:
    """An ``AutoTokenizer`` from a local folder; if it has no pad token, the EOS token is used as pad."""
    folder = require_tokenizer_folder(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as err:  # noqa: BLE001 - tokenizers' Rust parser raises its own exception types
        raise ModelFileError(f"could not load a tokenizer from {str(folder)!r}: {type(err).__name__}: {error_summary(err)}") from err
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer in {str(folder)!r} has neither a pad nor an eos token; add one of them")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer

