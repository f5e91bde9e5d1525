"""The service's start-up checks: every mistake is one line, and comes before Ray starts."""

from __future__ import annotations

import socket

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.service.config import SERVICE_ENTRY, compose_service_config
from rlflow.service.main import prepare


def _prepared(overrides: list[str]) -> object:
    return prepare(compose_service_config(overrides))


@pytest.mark.parametrize("overrides,message", [
    (["service.models.tiny=/nowhere"], "config key 'service.api_keys': set at least one key"),
    (["service.api_keys=[secret]", "service.models.tiny=/nowhere"], "keys must start with 'tml-'"),
    (["service.api_keys=[tml-a]"], "config key 'service.models': name at least one base model"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "engine.name=nope"], "engine.name"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "+service.prot=1"], "service.prot"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "service.max_sample_batch=0"],
     "config key 'service.max_sample_batch': must be >= 1"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "rollout.calculate_log_probs=false"],
     "config key 'rollout.calculate_log_probs': the service's samples carry each token's log-prob"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "rollout.tensor_parallel_size=2"],
     "config key 'rollout.tensor_parallel_size': the service runs each base model's rollout beside its trainer in one "
     "worker process"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/x", "service.port=70000"],
     "config key 'service.port': must be in [1, 65535], got 70000"),
    (["service.api_keys=[tml-a]", "service.models.tiny=/nowhere"], "config key 'service.models': "),
])
def test_config_mistakes_are_one_line(overrides, message):
    assert message in one_line_error(_prepared, overrides)


def test_a_port_in_use_is_one_line(tiny_model, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = one_line_error(_prepared, ["service.api_keys=[tml-a]", f"service.models.tiny={tiny_model}",
                                             f"service.port={port}", f"service.checkpoint_dir={tmp_path}"])
    assert f"config key 'service.port': cannot listen on 127.0.0.1:{port}" in message


def test_a_checkpoint_dir_that_is_a_file_is_one_line(tiny_model, tmp_path):
    (tmp_path / "a_file").write_text("mine")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    message = one_line_error(_prepared, ["service.api_keys=[tml-a]", f"service.models.tiny={tiny_model}",
                                         f"service.port={port}", f"service.checkpoint_dir={tmp_path / 'a_file'}"])
    assert message == f"config key 'service.checkpoint_dir': {tmp_path / 'a_file'} is a file; name a folder"
    assert (tmp_path / "a_file").read_text() == "mine"


def test_the_command_exits_2_with_one_line_before_ray_starts(tmp_path):
    line = cli_refusal(["-m", "rlflow.service", "service.api_keys=[tml-a]", "service.models.tiny=/nowhere",
                        f"service.checkpoint_dir={tmp_path}", f"trainer.ray_temp_dir={tmp_path / 'ray'}"], ray_dir=tmp_path / "ray")
    assert line.startswith("config key 'service.models': ")


def test_validate_checks_models_port_and_checkpoint_folder_and_creates_nothing(tiny_model, tmp_path):
    with socket.socket() as probe:  # a port free a moment ago: the check binds it and lets go
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    overrides = ["service.api_keys=[tml-a]", f"service.models.tiny={tiny_model}", f"service.port={port}"]
    SERVICE_ENTRY.preflight(compose_service_config(overrides + [f"service.checkpoint_dir={tmp_path / 'new' / 'ckpt'}"]))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a_file").write_text("")
    message = one_line_error(lambda o: SERVICE_ENTRY.preflight(compose_service_config(o)),
                             overrides + [f"service.checkpoint_dir={tmp_path / 'a_file' / 'ckpt'}"])
    assert message.startswith("config key 'service.checkpoint_dir': ")
    assert "a_file is a file, so the path cannot be created" in message


def test_a_base_model_name_with_a_slash_is_set_as_a_mapping():
    """``service.models.<name>=`` cannot name ``org/name`` (Hydra's key grammar); the mapping form can."""
    config = compose_service_config(["service.api_keys=[tml-a]", "service.models={Qwen/Qwen3-8B-Base:/x}",
                                     "service.models.tiny=/y"])
    assert dict(config.service.models) == {"Qwen/Qwen3-8B-Base": "/x", "tiny": "/y"}
