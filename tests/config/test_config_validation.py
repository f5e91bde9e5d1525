"""Hydra configs compose, validate against the dataclass schema, and fail on bad keys with the key's name."""

import subprocess
import sys
from pathlib import Path

import pytest
from engine_lists import BUILTIN_ENGINES, builtin_engines_with
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.config.loading.hydra_entry import CONFIG_DIR, expand_group_shorthands
from rlflow.engines.base import Capability
from rlflow.trainer.entry_points import PPO_ENTRY, SFT_ENTRY

REPO = Path(__file__).resolve().parents[2]
VALUE_ENGINES = builtin_engines_with(Capability.VALUE_MODEL)


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=expand_group_shorthands(overrides, PPO_ENTRY.group_shorthands))


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "rloo", "reinforce_pp", "remax"])
@pytest.mark.parametrize("rollout", ["vllm", "hf"])
def test_every_group_option_validates(algorithm, rollout):
    cfg = PPO_ENTRY.load(compose_config("ppo_trainer", [f"algorithm={algorithm}", f"rollout={rollout}"]))
    assert cfg.rollout.name == rollout
    assert cfg.algorithm.adv_estimator in {"grpo", "gae", "rloo", "reinforce_plus_plus", "remax"}
    assert cfg.actor.engine.name == "fsdp2"


@pytest.mark.parametrize("engine", BUILTIN_ENGINES)
def test_engine_shorthand_picks_the_option_per_role(engine):
    """Every built-in engine, on every PPO role it can host (critic and reward model: ``Capability.VALUE_MODEL``)."""
    mounts = ["actor.engine"] + (["critic.engine", "reward.reward_model.engine"] if engine in VALUE_ENGINES else [])
    cfg = PPO_ENTRY.load(compose_config("ppo_trainer", [f"{mount}={engine}" for mount in mounts]))
    assert [OmegaConf.select(cfg, f"{mount}.name") for mount in mounts] == [engine] * len(mounts)
    assert cfg.ref.engine.name == "fsdp2", "a role the command line leaves alone keeps its engine"
    sft = SFT_ENTRY.load(compose_config("sft_trainer", [f"engine={engine}"]))
    assert sft.engine.name == engine


def test_the_value_engines_come_from_the_registry():
    assert {"fsdp", "fsdp2"} <= set(VALUE_ENGINES), f"the registry declares {VALUE_ENGINES}"


def test_shorthand_leaves_value_overrides_alone():
    assert expand_group_shorthands(["actor.engine=fsdp", "actor.engine.seed=3", "x=1"], {"actor.engine": "engine"}) == [
        "engine@actor.engine=fsdp", "actor.engine.seed=3", "x=1"]


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length"):
        PPO_ENTRY.load(compose_config("ppo_trainer", ["data.max_prompt_length=abc"]))


def test_wrong_type_inside_an_engine_names_the_full_key():
    cfg = compose_config("ppo_trainer", [])
    OmegaConf.update(cfg, "actor.engine.seed", "abc", force_add=True)
    with pytest.raises(ConfigError, match=r"actor\.engine\.seed"):
        PPO_ENTRY.load(cfg)


def test_misspelled_key_names_the_key():
    with pytest.raises(ConfigError, match=r"trainer\.totl_epochs"):
        PPO_ENTRY.load(compose_config("ppo_trainer", ["+trainer.totl_epochs=3"]))
    with pytest.raises(ConfigError, match=r"actor\.engine\.not_a_key"):
        PPO_ENTRY.load(compose_config("ppo_trainer", ["+actor.engine.not_a_key=1"]))


def test_unknown_engine_lists_the_registered_ones():
    cfg = compose_config("ppo_trainer", [])
    OmegaConf.update(cfg, "critic.engine.name", "nope")
    with pytest.raises(ConfigError) as raised:
        PPO_ENTRY.load(cfg)
    assert str(raised.value).startswith("unknown engine 'nope' (config key critic.engine.name); registered: ")
    assert "fsdp2" in str(raised.value) and str(raised.value).count("config key") == 1


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_the_resolved_config():
    result = run_cli("--cfg", "job", "actor.engine=fsdp")
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout)
    assert printed.actor.engine.name == "fsdp" and printed.algorithm.adv_estimator == "grpo"


def test_cli_bad_type_is_one_line_naming_the_key():
    result = run_cli("data.max_prompt_length=abc")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.max_prompt_length" in lines[0], result.stderr


def test_cli_misspelled_key_fails_naming_it():
    result = run_cli("trainer.totl_epochs=3")
    assert result.returncode != 0 and "totl_epochs" in result.stderr
    assert "Traceback" not in result.stderr
