"""The ``auto`` speed settings (``rlflow/config/loading/auto_settings.py``): what each becomes for a run's device,
length and prompt groups, composed the way ``main_ppo``, ``main_sft`` and the service compose them; a value set
on the command line is kept; the start-up line says the values a run's roles get."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlflow.config.loading.auto_settings import REPAYING_STEPS, RunKeys, speed_settings_line
from rlflow.service.config import compose_service_config
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config
from rlflow.trainer.ppo_setup import PPO_RUN_KEYS

SPEED_KEYS = ("attn_implementation", "share_prefix", "compile")


def speed(config, mount: str = "actor.engine") -> dict:
    """The speed keys of the engine at ``mount`` and the rollout's ``enforce_eager`` (where there is a rollout)."""
    node = OmegaConf.select(config, mount)
    values = {key: node[key] for key in SPEED_KEYS if key in node}
    if "rollout" in config:
        values["enforce_eager"] = config.rollout.enforce_eager
    return values


def test_a_short_cpu_grpo_run_attends_varlen_and_shares_prompts_without_compiling():
    config = compose_ppo_config(["trainer.device=cpu", "rollout.n=8", "trainer.total_training_steps=30"])
    assert speed(config) == {"attn_implementation": "sdpa_varlen", "share_prefix": True, "compile": False,
                             "enforce_eager": True}
    assert speed(config, "ref.engine")["share_prefix"] is True


def test_a_cpu_run_long_enough_to_repay_its_start_up_compiles_and_captures_graphs():
    long = [f"trainer.total_training_steps={REPAYING_STEPS}", "trainer.device=cpu"]
    assert speed(compose_ppo_config(long))["compile"] is True
    assert speed(compose_ppo_config(long))["enforce_eager"] is False
    short = [f"trainer.total_training_steps={REPAYING_STEPS - 1}", "trainer.device=cpu"]
    assert speed(compose_ppo_config(short))["compile"] is False
    unknown = compose_ppo_config(["trainer.device=cpu"])  # epochs over the data: the length is not known yet
    assert speed(unknown)["compile"] is False and speed(unknown)["enforce_eager"] is True
    lora = compose_ppo_config([*long, "actor.engine.lora.rank=4"])
    assert speed(lora)["compile"] is False and speed(lora, "ref.engine")["compile"] is True


def test_a_gpu_run_keeps_sdpa_and_takes_vllms_graphs():
    config = compose_ppo_config(["trainer.device=cuda", f"trainer.total_training_steps={REPAYING_STEPS}"])
    assert speed(config) == {"attn_implementation": "sdpa", "share_prefix": False, "compile": False,
                             "enforce_eager": False}


def test_rows_that_share_no_prompt_are_not_laid_out_shared():
    config = compose_ppo_config(["trainer.device=cpu", "rollout.n=1"])
    assert speed(config)["attn_implementation"] == "sdpa_varlen" and speed(config)["share_prefix"] is False
    sft = compose_sft_config(["trainer.device=cpu"])
    assert speed(sft, "engine") == {"attn_implementation": "sdpa_varlen", "share_prefix": False, "compile": False}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ulysses_gets_its_kernel_on_any_device_and_no_shared_prefix(device):
    config = compose_ppo_config([f"trainer.device={device}", "actor.engine.ulysses_sequence_parallel_size=2",
                                 "trainer.n_procs_per_node=2"])
    assert speed(config)["attn_implementation"] == "sdpa_varlen" and speed(config)["share_prefix"] is False


def test_values_set_on_the_command_line_are_kept():
    config = compose_ppo_config(["trainer.device=cpu", "actor.engine.attn_implementation=sdpa",
                                 "rollout.enforce_eager=false", "ref.engine.share_prefix=false",
                                 f"trainer.total_training_steps={REPAYING_STEPS}", "actor.engine.compile=false"])
    assert speed(config) == {"attn_implementation": "sdpa", "share_prefix": False, "compile": False,
                             "enforce_eager": False}
    assert speed(config, "ref.engine") == {"attn_implementation": "sdpa_varlen", "share_prefix": False,
                                           "compile": True, "enforce_eager": False}


def test_an_engine_device_overrides_the_trainers_for_its_own_keys():
    config = compose_ppo_config(["trainer.device=cuda", "ref.engine.device=cpu"])
    assert speed(config, "ref.engine")["attn_implementation"] == "sdpa_varlen"
    assert speed(config)["attn_implementation"] == "sdpa"


def test_the_service_has_no_run_length_so_it_compiles_nothing():
    config = compose_service_config(["trainer.device=cpu", "service.api_keys=[tml-auto]",
                                     "service.models.tiny=/nonexistent"])
    assert speed(config, "engine") == {"attn_implementation": "sdpa_varlen", "share_prefix": False,
                                       "compile": False, "enforce_eager": True}


def test_the_start_up_line_names_the_roles_values_and_the_run():
    config = compose_ppo_config(["trainer.device=cpu", "rollout.n=8", "trainer.total_training_steps=30"])
    line = speed_settings_line(config, ["actor.engine", "ref.engine"], PPO_RUN_KEYS)
    assert line.startswith("speed settings (cpu, 30 steps, groups of 8): actor.engine: attn_implementation=sdpa_varlen "
                           "share_prefix=true compile=false; ref.engine: ")
    assert "rollout: enforce_eager=true" in line and "critic" not in line and "\n" not in line
    sft_line = speed_settings_line(compose_sft_config(["trainer.device=cpu"]), ["engine"], RunKeys())
    assert "engine: attn_implementation=sdpa_varlen share_prefix=false compile=false" in sft_line
    assert "rollout" not in sft_line.split("(auto values")[0]
