"""What Hydra itself refuses or lets through broken (an empty group, a deleted node, a node replaced by a value, an
override it cannot parse) is one line naming the override or key, exit 2, before Ray starts."""

from __future__ import annotations

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"


@pytest.mark.parametrize("override, message", [
    ("trainer=", "config key 'trainer': holds keys (trainer.NAME=VALUE), not a value; got ''"),
    ("~actor", "config key 'actor': missing (deleted on the command line?)"),
    ("~actor.engine", "config key 'actor.engine': missing (deleted on the command line?); the policy needs an engine"),
    ("actor.policy_loss=3", "config key 'actor.policy_loss': holds keys (actor.policy_loss.NAME=VALUE), not a value; got 3"),
    ("rollout=", "command line: In 'ppo_trainer': Could not find 'rollout/'; choose one of hf, vllm"),
    ("data.train_files=[", f"command line: cannot parse the override 'data.train_files=[': no viable alternative at input '[' ({GRAMMAR})"),
    ("foo", "command line: cannot parse the override 'foo': missing EQUAL at '<EOF>'"),
])
def test_hydra_level_mistakes_are_one_line(override, message):
    assert one_line_error(compose_ppo_config, [override]).startswith(message)


def test_sft_deleted_engine_is_one_line():
    assert one_line_error(compose_sft_config, ["~engine"]).startswith("config key 'engine.name': no engine named")


@pytest.mark.parametrize("override, message", [
    ("actor.ppo_epochs==2", "command line: cannot parse the override 'actor.ppo_epochs==2': extraneous input '='"),
    ("trainer=", "config key 'trainer': holds keys"),
])
def test_the_cli_answers_hydra_level_mistakes_in_one_line_before_ray(tmp_path, override, message):
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", f"trainer.ray_temp_dir={tmp_path / 'ray'}", override],
                       ray_dir=tmp_path / "ray")
    assert line.startswith(message), line
