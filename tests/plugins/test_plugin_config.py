"""``trainer.plugins`` / ``trainer.external_lib`` in both entry points, and plugin engines picked by name without a YAML."""

from __future__ import annotations

from pathlib import Path

from one_line_errors import one_line_error
from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.engines.registry import build_engine
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config

HERE = Path(__file__).resolve().parent
USER_PLUGIN = HERE / "user_plugin.py"
OWN_CONFIG_ENGINE = HERE / "own_config_engine.py"


def test_plugins_are_normalized_and_external_lib_is_merged_in(monkeypatch):
    monkeypatch.chdir(HERE)
    config = compose_ppo_config(["trainer.plugins=user_plugin.py", f"trainer.external_lib=[{OWN_CONFIG_ENGINE}]"])
    assert list(config.trainer.plugins) == [str(USER_PLUGIN), str(OWN_CONFIG_ENGINE)]
    assert config.trainer.external_lib is None
    sft = compose_sft_config([f"trainer.external_lib={USER_PLUGIN}"])
    assert list(sft.trainer.plugins) == [str(USER_PLUGIN)]


def test_a_plugin_key_of_the_wrong_type_names_the_key():
    assert "'trainer.plugins'" in one_line_error(compose_ppo_config, ["trainer.plugins=[1]"], ConfigError)


def test_fsdp2_subclass_gets_fsdp2_defaults_and_its_own_keys(tmp_path):
    config = compose_ppo_config([f"trainer.plugins=[{USER_PLUGIN}]", "actor.engine.name=user_fsdp2",
                                 f"actor.engine.marker_dir={tmp_path}", "actor.engine.optimizer.lr=0.5"])
    engine = config.actor.engine
    assert engine.name == "user_fsdp2" and engine.marker_dir == str(tmp_path) and engine.optimizer.lr == 0.5
    assert engine.reshard_after_forward is True and engine.hybrid_replicate_size == 1  # FSDP2EngineConfig's defaults
    assert config.critic.engine.name == "fsdp2", "the other roles keep their engines"


def test_engine_with_its_own_config_class_needs_no_yaml(tmp_path):
    config = compose_sft_config([f"trainer.plugins=[{OWN_CONFIG_ENGINE}]", "engine=user_ddp", "engine.bucket_cap_mb=5"])
    node = OmegaConf.to_container(config.engine)
    assert node["name"] == "user_ddp" and node["bucket_cap_mb"] == 5
    assert node["micro_batch_size"] == 8 and node["optimizer"]["lr"] == 3.0e-3, "sft_trainer.yaml's engine settings apply"
    assert "reshard_after_forward" not in node, "no fsdp2 keys leak into another engine's node"
    engine = build_engine(node, model_path=tmp_path)
    assert type(engine).__name__ == "UserDDPEngine" and engine.config.bucket_cap_mb == 5


def test_key_the_plugin_engine_does_not_have_names_key_and_class():
    message = one_line_error(compose_sft_config, [f"trainer.plugins=[{OWN_CONFIG_ENGINE}]", "engine.name=user_ddp",
                                                  "engine.reshard_after_forward=false"], ConfigError)
    assert "'engine.reshard_after_forward'" in message and "UserDDPEngineConfig" in message


def test_name_override_picks_a_builtin_engine_with_its_yaml():
    engine = compose_ppo_config(["actor.engine.name=fsdp"]).actor.engine
    assert engine.name == "fsdp" and "sharding_strategy" in engine and "reshard_after_forward" not in engine


def test_unknown_engine_without_plugin_lists_registered_engines():
    message = one_line_error(compose_ppo_config, ["actor.engine=user_fsdp3"], ConfigError)
    assert "(config key actor.engine.name)" in message and "user_fsdp3" in message and "fsdp2" in message
