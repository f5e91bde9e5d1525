"""No silent footgun in choosing the model: a mistyped model.path, or model=hf without one, fails in one line.

The preset is only ever built into rlflow's own folder (``model.path`` null); an explicit
``model.path`` is loaded as it is and never created, whatever ``model.preset`` says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlflow.config.schema import ModelConfig
from rlflow.models.ensure import ModelFolderError, ensure_model, model_folder
from rlflow.trainer.entry_points import compose_ppo_config

REPO = Path(__file__).resolve().parents[2]


def _unread_corpus():
    raise AssertionError("the corpus was read although nothing may be built")
    yield  # pragma: no cover  (makes this a generator)


def test_a_mistyped_path_with_the_default_preset_fails_and_creates_nothing(tmp_path):
    typo = tmp_path / "models" / "qwen-7B"
    message = r"^model.path: model folder '.*qwen-7B' does not exist; rlflow never creates"
    with pytest.raises(ModelFolderError, match=message) as error:
        ensure_model(ModelConfig(path=str(typo), preset="tiny"), _unread_corpus())
    assert "\n" not in str(error.value)
    assert not typo.exists() and not typo.parent.exists()


def test_model_hf_without_a_path_fails_instead_of_falling_back():
    config = compose_ppo_config(["model=hf"])
    assert config.model.path is None and config.model.preset is None
    with pytest.raises(ModelFolderError, match=r"^model.path: not set, and no model.preset to build; pass model.path="):
        model_folder(config.model)


def test_an_explicit_folder_that_is_not_a_preset_loads_as_it_is(tmp_path, tiny_preset):
    plain = shutil.copytree(tiny_preset, tmp_path / "hf")
    (plain / "rlflow_preset.json").unlink()  # any HF folder: no preset marker
    assert ensure_model(ModelConfig(path=str(plain), preset="tiny"), _unread_corpus()) == plain


def test_the_default_group_names_rlflows_own_folder():
    config = compose_ppo_config([])
    assert config.model.path is None and str(model_folder(config.model)) == "outputs/models/tiny"
    assert str(model_folder(compose_ppo_config(["model.preset=tiny-llama"]).model)) == "outputs/models/tiny-llama"


def test_main_ppo_exits_2_with_one_line_before_ray_and_creates_no_folder(tmp_path):
    typo = tmp_path / "outputs" / "modles" / "tiny"
    args = [f"model.path={typo}", f"trainer.default_local_dir={tmp_path / 'run'}"]
    result = subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: model.path: model folder '{typo}' does not exist"), lines
    assert not (tmp_path / "outputs").exists()
