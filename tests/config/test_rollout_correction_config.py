"""``algorithm.rollout_correction``: verl's defaults, the presets (``rollout_correction=NAME``), and the start-up
check: every bad input class is one ``ConfigError`` line (a ``UserError``: the CLI exits 2) naming the key.

One config is composed with Hydra (with ``rollout.calculate_log_probs=true``, which every correction needs); the
cases change copies of it (a compose takes seconds). The PPO entry point runs the check (its ``checks``), so a bad
command line exits 2 with one line before Ray starts.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import ray
from omegaconf import OmegaConf
from one_line_errors import one_line_error

from rlflow.algos import POLICY_LOSS_REGISTRY, check_rollout_correction
from rlflow.config import ConfigError
from rlflow.config.loading.hydra_entry import CONFIG_DIR
from rlflow.trainer import main_ppo
from rlflow.trainer.entry_points import compose_ppo_config

LOG_PROBS = "rollout.calculate_log_probs=true"

SECTION = "algorithm.rollout_correction"
PRESETS = {
    "disabled": dict(rollout_is=None, rollout_rs=None, bypass_mode=False),
    "decoupled_token_is": dict(rollout_is="token", rollout_is_threshold=2.0),
    "decoupled_seq_is": dict(rollout_is="sequence", rollout_is_threshold=2.0),
    "decoupled_seq_is_rs": dict(rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
    "decoupled_k3_rs": dict(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "icepop": dict(rollout_is="token", rollout_is_threshold="0.5_5.0", rollout_rs=None),
    "bypass_ppo_clip": dict(rollout_is=None, bypass_mode=True, loss_type="ppo_clip"),
    "bypass_pg_is": dict(rollout_is="sequence", bypass_mode=True, loss_type="reinforce"),
}


@pytest.fixture(scope="module")
def base():
    return compose_ppo_config([LOG_PROBS])


def checked(base, changes: dict):
    """A copy of ``base`` with ``changes`` (key -> value) set, after the check passed on it."""
    config = copy.deepcopy(base)
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    check_rollout_correction(config)
    return config


def preset(name: str) -> dict:
    """The keys a preset file sets, under their full names (its Hydra defaults list left out: the rest is disabled's)."""
    values = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "rollout_correction" / f"{name}.yaml"))
    return {f"{SECTION}.{key}": value for key, value in values.items() if key != "defaults"}


def test_defaults_are_verls_metrics_only_without_rollout_log_probs():
    default = compose_ppo_config([])
    assert dict(default.algorithm.rollout_correction) == dict(
        rollout_is=None, rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs=None,
        rollout_rs_threshold=None, bypass_mode=False, loss_type="ppo_clip")
    assert default.rollout.calculate_log_probs is False and default.rollout.debug_skip_weight_sync_steps == 0


def test_hydra_picks_a_preset_by_name_and_a_key_overrides_it():
    config = compose_ppo_config([LOG_PROBS, "rollout_correction=icepop", f"{SECTION}.rollout_is_batch_normalize=true"])
    check_rollout_correction(config)
    settings = config.algorithm.rollout_correction
    assert settings.rollout_is == "token" and settings.rollout_is_threshold == "0.5_5.0"
    assert settings.rollout_is_batch_normalize is True


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_passes_the_check(base, name):
    assert sorted(path.stem for path in (Path(CONFIG_DIR) / "rollout_correction").glob("*.yaml")) == sorted(PRESETS)
    settings = checked(base, preset(name)).algorithm.rollout_correction
    assert {key: settings[key] for key in PRESETS[name]} == PRESETS[name]


def test_comma_joined_options_with_per_option_thresholds_pass(base):
    checked(base, {f"{SECTION}.rollout_rs": "token_k1,seq_max_k3", f"{SECTION}.rollout_rs_threshold": "0.5_2.0,0.7"})


RS = f"{SECTION}.rollout_rs"
RS_THRESHOLD = f"{SECTION}.rollout_rs_threshold"
IS_THRESHOLD = f"{SECTION}.rollout_is_threshold"
BAD_INPUTS = {  # case: (changes, the key the message names)
    "unknown_level": ({f"{SECTION}.rollout_is": "tokens"}, f"{SECTION}.rollout_is"),
    "threshold_not_a_number": ({f"{SECTION}.rollout_is": "token", IS_THRESHOLD: "abc"}, IS_THRESHOLD),
    "threshold_negative": ({f"{SECTION}.rollout_is": "token", IS_THRESHOLD: -2.0}, IS_THRESHOLD),
    "threshold_bounds_reversed": ({f"{SECTION}.rollout_is": "token", IS_THRESHOLD: "5.0_0.5"}, IS_THRESHOLD),
    "unknown_rs_option": ({RS: "seq_max_k1", RS_THRESHOLD: 2.0}, RS),
    "rs_without_threshold": ({RS: "seq_mean_k3"}, RS_THRESHOLD),
    "k2_with_two_bounds": ({RS: "token_k2", RS_THRESHOLD: "0.1_0.5"}, RS_THRESHOLD),
    "threshold_count": ({RS: "token_k1,token_k2", RS_THRESHOLD: "2.0,0.1,0.1"}, RS_THRESHOLD),
    "bypass_without_log_probs": ({f"{SECTION}.bypass_mode": True, "rollout.calculate_log_probs": False},
                                 "rollout.calculate_log_probs"),
    "weights_without_log_probs": ({f"{SECTION}.rollout_is": "token", "rollout.calculate_log_probs": False},
                                  "rollout.calculate_log_probs"),
    "reinforce_outside_bypass": ({f"{SECTION}.loss_type": "reinforce"}, f"{SECTION}.loss_type"),
    "unknown_loss_type": ({f"{SECTION}.bypass_mode": True, f"{SECTION}.loss_type": "pg"}, f"{SECTION}.loss_type"),
    "bypass_with_another_loss": ({f"{SECTION}.bypass_mode": True, "actor.policy_loss.loss_mode": "gspo"},
                                 f"{SECTION}.bypass_mode"),
    "bypass_loss_by_hand": ({"actor.policy_loss.loss_mode": "bypass_mode"}, "actor.policy_loss.loss_mode"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_config_error_line_naming_the_key(base, case):
    changes, key = BAD_INPUTS[case]
    message = one_line_error(lambda _: checked(base, changes), [], error=ConfigError)
    assert f"config key {key}" in message or f"config key '{key}'" in message, message


def test_weights_for_a_loss_without_the_keyword_are_refused(base):
    with POLICY_LOSS_REGISTRY.temporary():
        @POLICY_LOSS_REGISTRY.register("no_weights")
        def no_weights(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
            raise AssertionError("not called")

        changes = {"actor.policy_loss.loss_mode": "no_weights", **preset("decoupled_token_is")}
        message = one_line_error(lambda _: checked(base, changes), [], error=ConfigError)
    assert f"'{SECTION}.rollout_is'" in message and "'no_weights' takes no rollout_is_weights" in message


def test_the_command_line_exits_2_with_one_line_before_ray_starts(tmp_path, monkeypatch, capsys):
    """main_ppo's own ``main`` (in-process: a subprocess spends a minute importing) runs the check in its entry
    point: rejection without a threshold stops it before Ray, a model or a run folder is touched."""
    ray_dir = tmp_path / "ray"
    monkeypatch.setattr(sys, "argv", ["main_ppo", LOG_PROBS, f"{RS}=seq_mean_k3", f"trainer.ray_temp_dir={ray_dir}",
                                      f"trainer.default_local_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'model'}"])
    with pytest.raises(SystemExit) as exited:
        main_ppo.main()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and RS_THRESHOLD in lines[0], lines
    assert not ray.is_initialized() and not ray_dir.exists() and not (tmp_path / "model").exists()
    assert not (tmp_path / "run").exists()
