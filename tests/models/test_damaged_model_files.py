"""A damaged model or tokenizer folder is one line naming the file (and the offset or tensor), before any worker
loads it: a truncated or inconsistent ``model.safetensors``, a cut-off ``config.json``, a garbage ``tokenizer.json``,
weights of another size than the config says. One case runs ``main_ppo`` on such a folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
from one_line_errors import cli_refusal

from rlflow.models.ensure import ModelFolderError, ensure_model


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


def _cut_config(folder: Path) -> None:
    config = folder / "config.json"
    config.write_text(config.read_text()[:40])


def _garbage_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_bytes(b"\x00garbage{")


def _other_vocab(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] += 8
    (folder / "config.json").write_text(json.dumps(config))


def _bad_header(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8] = ord("X")  # the header's opening brace
    weights.write_bytes(bytes(data))


def _cut_generation_config(folder: Path) -> None:
    (folder / "generation_config.json").write_text('{"eos_token_id": [')


def _index_without_map(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')


DAMAGES: dict[str, tuple[Callable[[Path], None], str, str]] = {  # name -> (damage, key, words)
    "truncated-weights": (_truncate, "model.path", "model.safetensors: cut short at byte "),
    "cut-config": (_cut_config, "model.path", "config.json: not valid JSON at line "),
    "garbage-tokenizer": (_garbage_tokenizer, "model.path", "tokenizer.json: not valid JSON at line 1, column 1 (character 0)"),
    "other-vocab": (_other_vocab, "model.path", "in the weight files but"),
    "bad-header": (_bad_header, "model.path", "model.safetensors: not valid JSON at line 1, column 1"),
    "cut-generation-config": (_cut_generation_config, "model.path", "generation_config.json: not valid JSON at line 1"),
    "index-without-map": (_index_without_map, "model.path", "model.safetensors.index.json: has no weight_map object"),
}


@pytest.fixture
def damaged(tiny_preset, tmp_path) -> Callable[[str], Path]:
    def make(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(tiny_preset, folder)
        DAMAGES[name][0](folder)
        return folder
    return make


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_damaged_model_folder_is_one_line_naming_the_file(damaged, name):
    folder = damaged(name)
    _, key, words = DAMAGES[name]
    with pytest.raises(ModelFolderError) as error:
        ensure_model(SimpleNamespace(path=str(folder), preset=None, preset_seed=0, tokenizer_path=None,
                                     trust_remote_code=False), [])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{key}: ") and str(folder) in message and words in message, message


def test_a_tokenizer_path_error_names_model_tokenizer_path(damaged, tiny_preset):
    tokenizer = damaged("garbage-tokenizer")
    with pytest.raises(ModelFolderError, match=r"^model\.tokenizer_path: .*tokenizer\.json: not valid JSON"):
        ensure_model(SimpleNamespace(path=str(tiny_preset), preset=None, preset_seed=0, tokenizer_path=str(tokenizer),
                                     trust_remote_code=False), [])


def test_main_ppo_refuses_truncated_weights_before_ray(damaged, tmp_path):
    folder = damaged("truncated-weights")
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", "model=hf", f"model.path={folder}",
                        f"trainer.ray_temp_dir={tmp_path / 'ray'}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       ray_dir=tmp_path / "ray")
    assert line.startswith(f"model.path: {folder / 'model.safetensors'}: cut short at byte "), line
    assert not (tmp_path / "run").exists(), "the run folder (created with its lock before the model check) is removed"
