"""ensure_model: builds the configured preset into rlflow's own folder, or checks an explicit folder; one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from rlflow.config.schema import ModelConfig
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.errors import UserError
from rlflow.models.ensure import ModelFolderError, ensure_model, preset_folder


def _unread_corpus():
    raise AssertionError("the corpus was read although no preset is built")
    yield  # pragma: no cover  (makes this a generator)


def test_builds_the_preset_in_its_own_folder_when_missing_then_reuses_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ModelConfig(path=None, preset="tiny-qwen3", preset_seed=2)
    path = ensure_model(config, tokenizer_corpus())
    assert path == preset_folder("tiny-qwen3", 2) and str(path) == "outputs/models/tiny-qwen3-seed2"
    marker = json.loads((path / "rlflow_preset.json").read_text())
    assert (marker["preset"], marker["seed"], marker["options"]["architecture"]) == ("tiny-qwen3", 2, "qwen3")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model(config, tokenizer_corpus()) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_without_a_preset_the_folder_must_exist_and_the_corpus_is_not_read(tmp_path):
    with pytest.raises(ModelFolderError, match="^model.path: model folder .* does not exist"):
        ensure_model(ModelConfig(path=str(tmp_path / "nowhere"), preset=None), _unread_corpus())


def test_preset_errors_name_the_preset_in_one_line(tmp_path, monkeypatch, tiny_preset):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFolderError, match="^model.preset='huge': unknown preset 'huge'; presets: ") as error:
        ensure_model(ModelConfig(path=None, preset="huge"), tokenizer_corpus())
    assert isinstance(error.value, UserError) and "\n" not in str(error.value)
    built = shutil.copytree(tiny_preset, tmp_path / "b")  # an explicit folder holding the tiny preset
    assert ensure_model(ModelConfig(path=str(built), preset="tiny"), tokenizer_corpus()) == built
    with pytest.raises(ModelFolderError, match="^model.preset='tiny-llama': .* holds a preset built with .*overwrite"):
        ensure_model(ModelConfig(path=str(built), preset="tiny-llama"), tokenizer_corpus())
