"""Every config value that must be one of a set is checked in config loading, before Ray starts.

Each choice key of each entry point is misspelled in turn (in-process, as ``main_ppo`` /
``main_sft`` compose it) and must fail with one line naming the key; a guard walks the schemas
so a new choice field cannot be left out of the table; one command-line case shows exit 2, one
line, and that no Ray session was started.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
from one_line_errors import one_line_error

from rlflow.config.loading.choices import Choice
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.engines.config import HFModuleEngineConfig
from rlflow.errors import UserError
from rlflow.observability.tracking import TRACKER_REGISTRY
from rlflow.trainer.entry_points import (
    PPO_ENGINE_MOUNTS,
    PPO_ENTRY,
    SFT_ENGINE_MOUNTS,
    SFT_ENTRY,
    compose_ppo_config,
    compose_sft_config,
)

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "plugins" / "user_plugin.py"
BAD = "zz_not_a_choice"
# list-valued choice keys -> a legal first item (the misspelled value is the second)
LIST_KEYS = {"trainer.logger": "console", **{f"{mount}.lora.parts": "mlp" for mount in (*PPO_ENGINE_MOUNTS, *SFT_ENGINE_MOUNTS)}}

# String fields whose value is free text (a path, a name, a column, a spec), not one of a set.
FREE_TEXT = {
    "model.path", "model.tokenizer_path", "data.prompt_key", "data.messages_key", "data.response_key",
    "reward.custom_function", "reward.reward_model.path", "critic.model.path", "trainer.project_name", "trainer.experiment_name",
    "trainer.ray_address", "trainer.ray_temp_dir", "trainer.default_local_dir", "trainer.resume_from_path",
    "trainer.export_hf_dir", "trainer.plugins", "rollout.stop", "rollout.val_kwargs.stop", "data.train_files",
    "data.val_files", "trainer.ray_node_ip_address", "trainer.export_lora_adapter_dir",
}
# Names checked by rlflow.algos.check_rollout_correction against their registries (rollout_rs: comma-joined options).
ROLLOUT_CORRECTION_NAMES = {f"algorithm.rollout_correction.{key}" for key in ("rollout_is", "rollout_rs", "loss_type")}
# Engine keys handed to the model library or checked by the engine that owns them.
ENGINE_FREE_TEXT = {"name", "attn_implementation", "wrap_layer_classes", "lora.target_modules", "lora.adapter_path"}


def _misspelled(key: str) -> str:
    return f"{key}=[{LIST_KEYS[key]},{BAD}]" if key in LIST_KEYS else f"{key}={BAD}"


def _one_line_error(compose, overrides: list[str]) -> str:
    message = one_line_error(compose, overrides)
    assert BAD in message, message
    return message


def _one_format(key: str) -> re.Pattern:
    """The unknown-name text of every choice, registry or table: ``unknown <kind> '<value>' (config key <key>); registered: ...``."""
    return re.compile(rf"unknown [\w -]+ '{BAD}' \(config key {re.escape(key)}\); registered: \S")


@pytest.mark.parametrize("key", [choice.key for choice in PPO_ENTRY.choices()])
def test_misspelled_ppo_choice_names_its_key(key):
    message = _one_line_error(compose_ppo_config, [_misspelled(key)])
    assert _one_format(key).match(message), message


@pytest.mark.parametrize("key", [choice.key for choice in SFT_ENTRY.choices()])
def test_misspelled_sft_choice_names_its_key(key):
    message = _one_line_error(compose_sft_config, [_misspelled(key)])
    assert _one_format(key).match(message), message


def test_a_table_choice_and_a_registry_choice_read_alike():
    table = _one_line_error(compose_ppo_config, [f"actor.engine.dtype={BAD}"])
    registry = _one_line_error(compose_ppo_config, [f"algorithm.adv_estimator={BAD}"])
    assert table == f"unknown dtype '{BAD}' (config key actor.engine.dtype); registered: bf16, bfloat16, float16, float32, fp16, fp32"
    assert registry.startswith(f"unknown advantage estimator '{BAD}' (config key algorithm.adv_estimator); registered: gae, ")


def test_a_choice_names_a_kind_exactly_when_it_checks_a_table():
    with pytest.raises(TypeError, match="give a kind for a table of names"):
        Choice("x.y", ("a", "b"))
    with pytest.raises(TypeError, match="none for a registry"):
        Choice("x.y", TRACKER_REGISTRY, "tracker")


def test_defaults_and_legal_variants_pass():
    config = compose_ppo_config(["algorithm.kl_penalty=k3+", "actor.kl_loss_type=low_var_kl+", "model.preset=null",
                                 "actor.engine.param_dtype=bf16", "trainer.allow_slow_half_precision=true", "trainer.logger=[console,jsonl,tensorboard]"])
    assert config.algorithm.kl_penalty == "k3+"
    compose_sft_config(["trainer.launcher=torchrun", "data.truncation=left"])


def test_a_name_a_plugin_registers_is_legal():
    """Plugins are imported before the check, so what they register is a legal value."""
    config = compose_ppo_config([f"trainer.plugins=[{PLUGIN}]", "actor.policy_loss.loss_mode=user_vanilla"])
    assert config.actor.policy_loss.loss_mode == "user_vanilla"
    with pytest.raises(UserError, match="actor.policy_loss.loss_mode"):
        compose_ppo_config(["actor.policy_loss.loss_mode=user_vanilla_typo"])


def _string_fields(schema: type, prefix: str = "") -> list[str]:
    """Dotted keys of the ``str`` / ``Optional[str]`` / ``list[str]`` fields of a dataclass schema."""
    keys = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += _string_fields(kind, f"{prefix}{f.name}.")
        elif kind in (str, typing.Optional[str], list[str]):
            keys.append(f"{prefix}{f.name}")
    return keys


@pytest.mark.parametrize(("schema", "table"), [(PPOConfig, PPO_ENTRY.choices()),
                                               (SFTConfig, SFT_ENTRY.choices())])
def test_every_choice_field_is_in_the_table(schema, table):
    checked = {choice.key for choice in table}
    engine_keys = [k for k in _string_fields(HFModuleEngineConfig) if k not in ENGINE_FREE_TEXT]
    mounts = PPO_ENGINE_MOUNTS if schema is PPOConfig else SFT_ENGINE_MOUNTS
    expected = {k for k in _string_fields(schema) if k not in FREE_TEXT | ROLLOUT_CORRECTION_NAMES}
    expected |= {f"{mount}.{key}" for mount in mounts for key in engine_keys}
    assert expected - checked == set(), "new choice fields: add them to rlflow/config/loading/choices.py (or the entry point's own choices) or FREE_TEXT"


def test_cli_bad_choice_exits_2_with_one_line_before_ray_starts(tmp_path):
    ray_dir = tmp_path / "ray"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rlflow.trainer.main_ppo", "algorithm.adv_estimator=grpoo", f"trainer.ray_temp_dir={ray_dir}",
         f"trainer.default_local_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'model'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "algorithm.adv_estimator" in lines[0] and "grpoo" in lines[0], result.stderr[-2000:]
    assert not ray_dir.exists() and not (tmp_path / "model").exists() and not (tmp_path / "run").exists()
    assert time.monotonic() - start < 90
