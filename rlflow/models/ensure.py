"""``ensure_model``: the model folder an entry point trains, built from the preset when configured."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlflow.errors import UserError
from rlflow.models.hf_checkpoint import require_model_folder, require_tokenizer_folder
from rlflow.models.presets import build_preset


class ModelFolderError(UserError, FileNotFoundError):
    """The configured model folder is missing, incomplete, holds a different preset, or the preset is unknown."""


def ensure_model(model_config: Any, tokenizer_corpus: Iterable[str]) -> Path:
    """Return ``model.path`` as a checked HF folder.

    With ``model.preset`` set, the preset is built there first if the folder is missing (an
    existing folder must hold that same preset), its tokenizer trained on ``tokenizer_corpus``
    (the drivers pass ``rlflow.data.tasks.corpus.tokenizer_corpus()``; it is read only when
    ``model.preset`` is set, also to check that an existing folder was built from it).
    Without it, the folder must already exist.
    """
    path = Path(model_config.path)
    if model_config.preset:
        try:
            build_preset(path, tokenizer_corpus, preset=model_config.preset, seed=model_config.preset_seed)
        except (FileExistsError, ValueError) as error:
            raise ModelFolderError(f"model.preset={model_config.preset!r}: {error}") from None
    try:
        require_model_folder(path)
        require_tokenizer_folder(model_config.tokenizer_path or path)
    except FileNotFoundError as error:
        raise ModelFolderError(f"model.path: {error}") from None
    return path
