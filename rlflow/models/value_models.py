"""Value models (critic, reward model) as standard Hugging Face classification models.

A value model is an HF ``*ForSequenceClassification`` or ``*ForTokenClassification`` model with
``num_labels=1``, the classes TRL and OpenRLHF save reward models and critics as. Its per-token
value is the score head applied to the last hidden state of every position; for a
sequence-classification model the value at a sequence's last token is HF's own pooled logit.

``load_value_model`` picks the class from the folder's ``config.json``:

- ``architectures`` names a ``*ForSequenceClassification`` / ``*ForTokenClassification`` class:
  that class, with its trained head (``num_labels`` must be 1);
- anything else (a causal LM, e.g. the actor's folder): ``AutoModelForTokenClassification`` with a
  fresh head, or, when ``value_head.safetensors`` lies beside the weights (rlflow's former format),
  that head copied into ``score`` (weight and bias, so values are unchanged).

Token-classification models are loaded with ``classifier_dropout=0.0``: a critic's values must not
be noisy in training. Saving (``save_pretrained`` or an engine's ``save_hf``) writes the class's
own format, which loads back with ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from rlflow.models.hf_checkpoint import load_pretrained, require_model_folder

__all__ = [
    "LEGACY_VALUE_HEAD_FILE", "VALUE_MODEL_CLASSES", "load_value_model", "per_token_values", "value_head",
    "value_model_export_config",
]

LEGACY_VALUE_HEAD_FILE = "value_head.safetensors"
_LEGACY_TO_HF = {"value_head.weight": "weight", "value_head.bias": "bias"}

# Suffix of the folder's architecture class -> the Auto class that loads it as a value model.
VALUE_MODEL_CLASSES: dict[str, type] = {
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
}
_FRESH_CLASS = AutoModelForTokenClassification  # causal-LM folders: per-token values, a head with a bias
_HEAD_NAMES = ("score", "classifier")  # the attribute HF classification models keep their head in


def _value_class(folder: Path, config: Any) -> type | None:
    """The Auto class of a classification folder (checking ``num_labels``), None for any other folder."""
    for architecture in getattr(config, "architectures", None) or []:
        for suffix, auto_cls in VALUE_MODEL_CLASSES.items():
            if architecture.endswith(suffix):
                if config.num_labels != 1:
                    raise ValueError(
                        f"value model folder {str(folder)!r} is a {architecture} with num_labels={config.num_labels}; "
                        "a reward model or critic needs one score (num_labels=1)"
                    )
                return auto_cls
    return None


def load_value_model(
    path: str | Path, dtype: str | torch.dtype = "float32", attn_implementation: str = "sdpa", **kwargs: Any
) -> PreTrainedModel:
    """An HF classification model with one label from a local folder (see the module docstring for the rules)."""
    folder = require_model_folder(path)
    auto_cls, config = _value_model_config(folder, kwargs.get("trust_remote_code", False))
    model = load_pretrained(auto_cls, folder, dtype, attn_implementation, config=config, **kwargs)
    legacy_head = folder / LEGACY_VALUE_HEAD_FILE
    if auto_cls is _FRESH_CLASS and legacy_head.is_file():
        _load_legacy_head(value_head(model), legacy_head)
    return model


def _value_model_config(folder: Path, trust_remote_code: bool = False) -> tuple[type, PretrainedConfig]:
    """The Auto class ``load_value_model`` uses for ``folder`` and the config it loads it with."""
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"could not read the config of {str(folder)!r}: {err}") from err
    auto_cls = _value_class(folder, config) or _FRESH_CLASS
    config.num_labels = 1
    if auto_cls is AutoModelForTokenClassification:
        config.classifier_dropout = 0.0
    return auto_cls, config


def value_model_export_config(folder: str | Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The ``config.json`` of an HF export of a value model loaded from ``folder``: its class named in
    ``architectures`` (what a live engine's export writes), found on a meta-device model without reading weights."""
    auto_cls, config = _value_model_config(Path(folder), trust_remote_code)
    with torch.device("meta"):
        model = auto_cls.from_config(config, trust_remote_code=trust_remote_code)
    config.architectures = [type(model).__name__]
    return config


def _load_legacy_head(head: nn.Linear, head_file: Path) -> None:
    """Copy ``value_head.weight``/``value_head.bias`` of rlflow's former format into ``head``."""
    state = load_file(str(head_file))
    if set(state) != set(_LEGACY_TO_HF) or head.bias is None:
        raise ValueError(f"{head_file} holds {sorted(state)}, expected {sorted(_LEGACY_TO_HF)}")
    with torch.no_grad():
        for legacy_name, param_name in _LEGACY_TO_HF.items():
            getattr(head, param_name).copy_(state[legacy_name].reshape(getattr(head, param_name).shape))


def value_head(model: nn.Module) -> nn.Linear:
    """The ``Linear(hidden, 1)`` score head of an HF classification model (``score`` or ``classifier``)."""
    for name in _HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear) and head.out_features == 1:
            return head
    raise ValueError(
        f"{type(model).__name__} has no one-output linear head named {' or '.join(_HEAD_NAMES)}; "
        "rlflow's value models are HF *ForSequenceClassification / *ForTokenClassification models with num_labels=1"
    )


def per_token_values(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    **attention_kwargs: torch.Tensor,
) -> torch.Tensor:
    """Values ``[B, T]`` in float32: the score head on the last hidden state of every token (``attention_kwargs``
    go to the model call, for an attention function that reads them)."""
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
        **attention_kwargs,
    ).last_hidden_state
    return value_head(model)(hidden).squeeze(-1).float()
