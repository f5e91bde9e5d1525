"""``ensure_model``: the model folder an entry point trains, built from the preset only into rlflow's own folder.

Two ways to name the model, and only the first ever writes anything:

* ``model.path: null`` with ``model.preset: NAME`` (the ``model: tiny`` group): rlflow's own folder
  for that preset, ``outputs/models/NAME`` (``NAME-seedS`` for ``model.preset_seed=S`` other than
  0), built on first use and reused after;
* ``model.path: DIR``: an existing HF folder, loaded as it is and never created, so a mistyped
  path fails at start-up instead of training a freshly built random model. If ``DIR`` holds an
  rlflow preset and ``model.preset`` is set, it must be that preset. ``model=hf`` sets no preset
  and needs ``model.path``.

Either way the folder is checked before any worker loads it: ``config.json`` and the tokenizer
files parse, and the safetensors weights are whole and fit the config (``weights_check``); a
failure is one line naming the key (``model.path``, or ``model.tokenizer_path`` for the tokenizer
folder when it is set) and the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlflow.errors import UserError
from rlflow.models.hf_checkpoint import ModelFileError, require_model_folder, require_tokenizer_folder
from rlflow.models.presets import PRESET_MARKER, build_preset
from rlflow.models.weights_check import check_safetensors_files, check_weights_fit_config

# Where the drivers build presets (relative to the working directory, like every default output folder).
PRESET_ROOT = Path("outputs/models")


class ModelFolderError(UserError, FileNotFoundError):
    """The configured model folder is missing, incomplete, holds a different preset, or the preset is unknown."""


def preset_folder(preset: str, seed: int = 0) -> Path:
    """rlflow's own folder for ``preset`` built with ``seed``: ``outputs/models/<preset>[-seed<seed>]``."""
    return PRESET_ROOT / (preset if seed == 0 else f"{preset}-seed{seed}")


def model_folder(model_config: Any) -> Path:
    """The folder ``model.path`` names, or with ``model.path`` null the preset's own folder (nothing is checked)."""
    if model_config.path:
        return Path(model_config.path)
    if not model_config.preset:
        raise ModelFolderError(
            "model.path: not set, and no model.preset to build; pass model.path=/path/to/hf/folder "
            "(model=hf), or leave it unset with model=tiny to use rlflow's tiny preset"
        )
    return preset_folder(model_config.preset, model_config.preset_seed)


def ensure_model(model_config: Any, tokenizer_corpus: Iterable[str]) -> Path:
    """Return the model folder (``model_folder``) as a checked HF folder, building the preset if it is rlflow's own.

    The preset's tokenizer is trained on ``tokenizer_corpus`` (the drivers pass
    ``rlflow.data.tasks.corpus.tokenizer_corpus()``); it is read only when ``model.preset`` is set
    and the folder is rlflow's own or holds a preset (to check it was built from the same corpus).
    """
    path = model_folder(model_config)
    own_folder = not model_config.path
    if not own_folder and not path.is_dir():
        raise ModelFolderError(
            f"model.path: model folder {str(path)!r} does not exist; rlflow never creates an explicit model.path "
            "(check the spelling). To use a preset, leave model.path unset (it is built into "
            f"{PRESET_ROOT}/<preset>), or build one there with `python -m rlflow.data.presets --out DIR`"
        )
    if model_config.preset and (own_folder or (path / PRESET_MARKER).is_file()):
        try:
            build_preset(path, tokenizer_corpus, preset=model_config.preset, seed=model_config.preset_seed)
        except (FileExistsError, ValueError) as error:
            raise ModelFolderError(f"model.preset={model_config.preset!r}: {error}") from None
    try:
        require_model_folder(path)
        shapes = check_safetensors_files(path)
        check_weights_fit_config(path, shapes, bool(model_config.trust_remote_code))
    except (FileNotFoundError, ModelFileError) as error:
        raise ModelFolderError(f"model.path: {error}") from None
    tokenizer_key = "model.tokenizer_path" if model_config.tokenizer_path else "model.path"
    try:
        require_tokenizer_folder(model_config.tokenizer_path or path)
    except (FileNotFoundError, ModelFileError) as error:
        raise ModelFolderError(f"{tokenizer_key}: {error}") from None
    return path


def check_model_folder(key: str, path: str | Path) -> Path:
    """``path``, the value of config key ``key``, as a checked HF model folder; ``ModelFolderError`` names the key."""
    try:
        folder = require_model_folder(path)
        check_safetensors_files(folder)
    except (FileNotFoundError, ModelFileError) as error:
        raise ModelFolderError(f"{key}: {error}") from None
    return folder
