"""The divergence guard's limits, counters and messages (rlflow/trainer/divergence.py), without a run."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.config import ConfigError
from rlflow.errors import CheckpointError, UserError
from rlflow.roles.critic import trailing_skipped_steps
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config
from rlflow.trainer.divergence import DivergenceError, DivergenceGuard, replace_non_finite


def test_reward_errors_abort_only_above_the_fraction():
    guard = DivergenceGuard(max_error_fraction=0.5)
    assert guard.check_reward_errors(4, 8, "reward function") == {"reward/error_fraction": 0.5}
    assert guard.check_reward_errors(0, 0, "reward function") == {"reward/error_fraction": 0.0}
    with pytest.raises(DivergenceError, match=r"^5 of 8 samples in this batch \(62%\) could not be scored by the reward "
                                              r"model and got reward.error_score, more than reward.max_error_fraction=0.5") as error:
        guard.check_reward_errors(5, 8, "reward model")
    assert isinstance(error.value, UserError) and "\n" not in str(error.value)
    assert DivergenceGuard(max_error_fraction=1.0).check_reward_errors(8, 8, "x") == {"reward/error_fraction": 1.0}


def test_skipped_steps_abort_after_n_in_a_row_per_model():
    guard = DivergenceGuard(max_consecutive_skipped_steps=3)
    counts = [guard.check_optim_step("actor", skipped)["actor/consecutive_skipped_steps"]
              for skipped in (True, True, False, True, True)]
    assert counts == [1, 2, 0, 1, 2]
    assert guard.check_optim_step("critic", True) == {"critic/consecutive_skipped_steps": 1.0}  # its own count
    with pytest.raises(DivergenceError, match=r"^actor: 3 optimizer steps in a row were skipped because the gradient "
                                              r"norm was not finite \(trainer.max_consecutive_skipped_steps=3\)"):
        guard.check_optim_step("actor", True)
    never = DivergenceGuard(max_consecutive_skipped_steps=0)
    assert [never.check_optim_step("train", True)["train/consecutive_skipped_steps"] for _ in range(50)][-1] == 50


def test_a_worker_side_update_continues_the_run_only_when_all_its_steps_were_skipped():
    """The critic's update runs its optimizer steps in the worker and reports (steps, trailing skipped)."""
    assert [trailing_skipped_steps(flags) for flags in ([], [False], [True], [True, False], [False, True, True])] == \
        [0, 0, 1, 0, 2]
    guard = DivergenceGuard(max_consecutive_skipped_steps=6)
    counts = [guard.check_optim_steps("critic", steps, trailing)["critic/consecutive_skipped_steps"]
              for steps, trailing in ((2, 1), (2, 2), (2, 0), (2, 2), (2, 2))]
    assert counts == [1, 3, 0, 2, 4]  # all skipped: the run goes on; one good step: it restarts at the trailing run
    assert guard.check_optim_step("actor", True) == {"actor/consecutive_skipped_steps": 1.0}  # per model
    with pytest.raises(DivergenceError, match=r"^critic: 7 optimizer steps in a row were skipped because the gradient "
                                              r"norm was not finite \(trainer.max_consecutive_skipped_steps=6\)"):
        guard.check_optim_steps("critic", 3, 3)  # the limit is passed inside one update: the count says by how much
    with pytest.raises(ValueError, match="3 trailing skipped steps out of 2"):
        guard.check_optim_steps("critic", 2, 3)


def test_the_guard_state_round_trips_through_the_driver_state_file(tmp_path):
    guard = DivergenceGuard(max_consecutive_skipped_steps=4)
    guard.check_optim_step("actor", True)
    guard.check_optim_steps("critic", 2, 2)
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"global_step": 1, "divergence_guard": guard.state_dict()}, lambda folder: None)
    resumed = DivergenceGuard(max_consecutive_skipped_steps=4)
    resumed.load_state_dict(manager.load_driver_state(manager.latest())["divergence_guard"])  # weights_only load
    assert resumed.consecutive_skipped == {"actor": 1, "critic": 2}
    assert resumed.check_optim_step("actor", True) == {"actor/consecutive_skipped_steps": 2.0}
    with pytest.raises(DivergenceError, match="^critic: 4 optimizer steps in a row"):
        resumed.check_optim_steps("critic", 2, 2)


def test_a_driver_state_without_the_guard_is_one_line_naming_the_key(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"global_step": 1}, lambda folder: None)  # an older rlflow's driver state
    with pytest.raises(CheckpointError, match=r"^checkpoint .*global_step_1: driver_state\.pt has no divergence_guard "
                                              r"\(written by an older rlflow\); start a new"):
        manager.load_driver_state(manager.latest(), ("global_step", "divergence_guard"))


@pytest.mark.parametrize("kwargs, key", [
    ({"max_error_fraction": 1.5}, "reward.max_error_fraction"),
    ({"max_error_fraction": -0.1}, "reward.max_error_fraction"),
    ({"max_consecutive_skipped_steps": -1}, "trainer.max_consecutive_skipped_steps"),
])
def test_limits_out_of_range_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"^config key '{key}': must be"):
        DivergenceGuard(**kwargs)


def test_non_finite_reward_model_scores_get_error_score_and_are_counted():
    scores = torch.tensor([[0.0, 0.5], [0.0, math.nan], [math.inf, 0.0], [0.0, -math.inf]])
    fixed, bad_rows = replace_non_finite(scores, error_score=-1.0)
    assert bad_rows == 3
    assert fixed.tolist() == [[0.0, 0.5], [0.0, -1.0], [-1.0, 0.0], [0.0, -1.0]]


def test_the_drivers_configs_carry_the_limits():
    ppo = DivergenceGuard.from_config(compose_ppo_config(["reward.max_error_fraction=0.25",
                                                          "trainer.max_consecutive_skipped_steps=7"]))
    assert (ppo.max_error_fraction, ppo.max_consecutive_skipped_steps) == (0.25, 7)
    default = DivergenceGuard.from_config(compose_ppo_config([]))
    assert (default.max_error_fraction, default.max_consecutive_skipped_steps) == (0.5, 5)
    sft = DivergenceGuard.from_config(compose_sft_config(["trainer.max_consecutive_skipped_steps=2"]))
    assert (sft.max_error_fraction, sft.max_consecutive_skipped_steps) == (1.0, 2)
