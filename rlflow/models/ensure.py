"""``ensure_model``: the model folder an entry point trains, built from the preset when configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.errors import UserError
from rlflow.models.hf_checkpoint import require_model_folder, require_tokenizer_folder
from rlflow.models.presets import build_preset


class ModelFolderError(UserError, FileNotFoundError):
    """The configured model folder is missing, incomplete, or holds a different preset."""


def ensure_model(model_config: Any) -> Path:
    """Return ``model.path`` as a checked HF folder.

    With ``model.preset`` set, the preset is built there first if the folder is missing (an
    existing folder must hold that same preset). Without it, the folder must already exist.
    """
    path = Path(model_config.path)
    try:
        if model_config.preset:
            build_preset(path, size=model_config.preset, seed=model_config.preset_seed)
        require_model_folder(path)
        require_tokenizer_folder(model_config.tokenizer_path or path)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        raise ModelFolderError(f"model.path: {error}") from None
    return path
