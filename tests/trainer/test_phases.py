"""``run_step`` and the phase contract, with stand-in roles recording each worker call.

The config, the algorithms (advantages, KL), ``ResponseScorer``, ``DivergenceGuard``,
``balance_batch`` and the rollout's output layout (``build_rollout_output``) are the real ones;
only the worker groups and the reward function are stand-ins, so the test checks the step's
composition: which calls each algorithm's step makes, in which order, with which ``meta_info``,
and that every phase finds the columns it declares it reads and returns the ones it declares it
writes (``StepRecord`` raises ``PhaseKeyError`` otherwise). The numerics of the real step are
checked end to end in ``tests/ppo``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from phases_testlib import (
    OLD_LOG_PROB,
    PROMPTS,
    ROLLOUT_LOG_PROB,
    StandInLoader,
    generate_fn,
    stand_in_context,
    stand_in_prompts,
    stand_in_reward,
)

from rlflow.meta_info import (GLOBAL_STEP, MINI_BATCH_SIZE, OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION,
                              ROLLOUT_IS_IN_LOSS, SEED, TEMPERATURE, VALIDATE)
from rlflow.protocol import DataProto
from rlflow.trainer.phases import StepState, run_step
from rlflow.trainer.phases.advantages import Advantages
from rlflow.trainer.phases.base import Phase, PhaseKeyError, StepRecord
from rlflow.trainer.phases.generate import GreedyBaselines
from rlflow.trainer.phases.rollout_correction import RolloutCorrection
from rlflow.trainer.training_modes import TRAINING_MODE_REGISTRY, BatchSource

UPDATE = ["free_rollout_memory", "forward_backward", "optim_step", "forward_backward", "optim_step", "sync_weights"]
CASES = {  # overrides, step -> the worker calls of that step, in order
    "grpo": ([], 1, ["generate_sequences", "compute_log_prob"] + UPDATE),
    "grpo_on_policy": (["actor.ppo_mini_batch_size=4"], 1,
                       ["generate_sequences", "free_rollout_memory", "forward_backward", "optim_step", "sync_weights"]),
    "grpo_kl_loss": (["actor.use_kl_loss=true"], 1, ["generate_sequences", "compute_log_prob", "compute_ref_log_prob"] + UPDATE),
    "ppo": (["algorithm=ppo", "critic.ppo_mini_batch_size=2"], 3,
            ["generate_sequences", "compute_log_prob", "compute_values", "free_rollout_memory", "update_critic"] + UPDATE[1:]),
    "ppo_warmup_kl_in_reward": (["algorithm=ppo", "critic.ppo_mini_batch_size=2", "critic.warmup_steps=1",
                                 "algorithm.use_kl_in_reward=true"], 1,
                                ["generate_sequences", "compute_log_prob", "compute_ref_log_prob", "compute_values", "update_critic"]),
    "remax": (["algorithm=remax"], 2, ["generate_sequences", "compute_log_prob", "generate_sequences"] + UPDATE),
    # rollout correction's rejection needs the old log-probs before the update (no reuse of the update's forward)
    "grpo_decoupled_rejection": (["actor.ppo_mini_batch_size=4", "rollout.calculate_log_probs=true",
                                  "rollout_correction=decoupled_seq_is_rs"], 1,
                                 ["generate_sequences", "compute_log_prob", "free_rollout_memory", "forward_backward",
                                  "optim_step", "sync_weights"]),
    # weights alone on an on-policy step: the update's loss computes them, no old-log-prob pass
    "grpo_decoupled_weights_in_loss": (["actor.ppo_mini_batch_size=4", "rollout.calculate_log_probs=true",
                                        "rollout_correction=decoupled_token_is"], 1,
                                       ["generate_sequences", "free_rollout_memory", "forward_backward", "optim_step",
                                        "sync_weights"]),
    # bypass mode: the rollout's log-probs are the old ones, no old-log-prob pass
    "grpo_bypass": (["rollout.calculate_log_probs=true", "rollout_correction=bypass_ppo_clip"], 1,
                    ["generate_sequences"] + UPDATE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_algorithm_step_makes_its_worker_calls_in_order(case):
    overrides, step, expected = CASES[case]
    calls: list[tuple[str, Any]] = []
    metrics = run_step(stand_in_context(overrides, calls), stand_in_prompts(), step)
    assert [name for name, _ in calls] == expected
    assert metrics["training/global_step"] == step and np.isfinite(metrics["critic/advantages/mean"])
    timed = {key for key in metrics if key.startswith("timing_s/")}
    assert {"timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/adv", "timing_s/generate"} <= timed


def test_the_calls_carry_the_meta_info_schema():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(["algorithm=remax", "actor.ppo_mini_batch_size=4"], calls)
    run_step(ctx, stand_in_prompts(), 7)
    sent = {}
    for name, data in calls:
        sent.setdefault(name, []).append(data)
    train, greedy = sent["generate_sequences"]
    assert GLOBAL_STEP.read(train.meta_info) == 7 and not VALIDATE.read(train.meta_info)
    assert GLOBAL_STEP.read(greedy.meta_info) == 7 and VALIDATE.read(greedy.meta_info) and len(greedy) == PROMPTS
    (update,) = sent["forward_backward"]  # one mini-batch: its old log-probs are the update forward's
    assert OLD_LOG_PROBS_FROM_UPDATE.read(update.meta_info) and "old_log_probs" not in update.batch
    assert TEMPERATURE.read(update.meta_info) == ctx.config.rollout.temperature


def test_the_critic_update_gets_its_mini_batch_size_and_seed():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(["algorithm=ppo", "critic.ppo_mini_batch_size=2", "trainer.seed=5"], calls)
    run_step(ctx, stand_in_prompts(), 3)
    (update,) = [data for name, data in calls if name == "update_critic"]
    assert MINI_BATCH_SIZE.read(update.meta_info) == 2 * ctx.config.rollout.n and SEED.read(update.meta_info) == 8
    assert TEMPERATURE.read(calls[1][1].meta_info) == ctx.config.rollout.temperature  # the old log-prob pass


def test_greedy_baselines_follow_each_row_by_uid():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(["algorithm=remax"], calls)
    state = StepState.begin(ctx, stand_in_prompts(), 1)
    rows = DataProto.from_dict({"r": torch.arange(6)}, {"uid": np.array(["0-2", "0-0", "0-3", "0-2", "0-1", "0-0"], dtype=object)})
    StepRecord().add(GreedyBaselines(), ctx, rows, state)
    prompts = DataProto(state.prompts.batch, state.prompts.non_tensor_batch, {VALIDATE.name: True})
    greedy_scores, _ = stand_in_reward(generate_fn(ctx.config)(prompts))
    per_prompt = greedy_scores.sum(-1)
    assert rows.batch["reward_baselines"].tolist() == pytest.approx([per_prompt[i].item() for i in (2, 0, 3, 2, 1, 0)])


def test_a_phase_without_a_column_it_reads_names_the_phase_and_the_column():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context([], calls)
    batch = DataProto.from_dict({"response_mask": torch.ones(2, 3)}, {"uid": np.array(["a", "b"], dtype=object)})
    with pytest.raises(PhaseKeyError, match=r"phase 'advantages' reads \['token_level_scores'\]"):
        StepRecord().add(Advantages(), ctx, batch, StepState.begin(ctx, stand_in_prompts(), 1))


def test_a_phase_that_writes_an_undeclared_column_is_refused():
    class Leaky(Phase):
        name, writes = "leaky", ("a",)

        def run(self, ctx, batch, state):
            return DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(2)})

    ctx = stand_in_context([], [])
    with pytest.raises(PhaseKeyError, match=r"phase 'leaky' declares it writes \['a'\] but returned \['a', 'b'\]"):
        StepRecord().add(Leaky(), ctx, DataProto.from_dict({"x": torch.zeros(2)}),
                         StepState.begin(ctx, stand_in_prompts(), 1))


def _sent(calls: list[tuple[str, Any]], name: str) -> list[DataProto]:
    return [data for called, data in calls if called == name]


LOG_PROBS = ["rollout.calculate_log_probs=true"]


def test_the_rollout_log_probs_give_the_off_policy_metrics_at_the_step_end_only_when_computed():
    calls: list[tuple[str, Any]] = []
    on_policy = stand_in_context(LOG_PROBS + ["actor.ppo_mini_batch_size=4"], calls)
    metrics = run_step(on_policy, stand_in_prompts(), 1)  # reused update forward
    gap = OLD_LOG_PROB - ROLLOUT_LOG_PROB
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(0.1)  # the update forward's -0.4 against -0.5
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.1) and "rollout_corr/rollout_is_mean" not in metrics
    metrics = run_step(stand_in_context(LOG_PROBS, []), stand_in_prompts(), 1)  # the separate pass's old log-probs
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(gap) and metrics["rollout_corr/kl"] == pytest.approx(-gap)
    plain = run_step(stand_in_context([], []), stand_in_prompts(), 1)
    assert not [key for key in plain if key.startswith(("rollout/logprob_diff", "rollout_corr/"))]


def test_decoupled_correction_hands_the_weights_to_every_mini_batch():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(LOG_PROBS + ["rollout_correction=decoupled_token_is"], calls)
    metrics = run_step(ctx, stand_in_prompts(), 1)
    ratio = float(np.exp(OLD_LOG_PROB - ROLLOUT_LOG_PROB))
    for mini in _sent(calls, "forward_backward"):
        mask = mini.batch["response_mask"].bool()
        assert torch.allclose(mini.batch["rollout_is_weights"][mask], torch.tensor(ratio))
        assert ROLLOUT_CORRECTION.read(mini.meta_info) is None
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(ratio)
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(OLD_LOG_PROB - ROLLOUT_LOG_PROB)
    assert metrics["timing_s/rollout_correction"] >= 0.0


def test_on_policy_weights_go_to_the_loss_as_settings_and_the_phase_reports_them_from_the_update():
    calls: list[tuple[str, Any]] = []
    metrics = run_step(stand_in_context(LOG_PROBS + ["rollout_correction=decoupled_token_is", "actor.ppo_mini_batch_size=4"],
                                calls), stand_in_prompts(), 1)
    (mini,) = _sent(calls, "forward_backward")
    assert ROLLOUT_IS_IN_LOSS.read(mini.meta_info) == {"rollout_is": "token", "rollout_is_threshold": 2.0}
    assert OLD_LOG_PROBS_FROM_UPDATE.read(mini.meta_info) and "rollout_is_weights" not in mini.batch
    assert (mini.batch["rollout_log_probs"][mini.batch["response_mask"].bool()] == ROLLOUT_LOG_PROB).all()
    update_forward = -0.4  # the stand-in update forward's log-prob of every token
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(float(np.exp(update_forward - ROLLOUT_LOG_PROB)))
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(update_forward - ROLLOUT_LOG_PROB)
    assert "timing_s/rollout_correction" not in metrics


def test_bypass_mode_hands_the_settings_and_the_rollout_log_probs_to_the_update():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(LOG_PROBS + ["rollout_correction=bypass_pg_is"], calls)
    metrics = run_step(ctx, stand_in_prompts(), 1)
    for mini in _sent(calls, "forward_backward"):
        settings = ROLLOUT_CORRECTION.read(mini.meta_info)
        assert settings["bypass_mode"] and settings["loss_type"] == "reinforce" and settings["rollout_is"] == "sequence"
        mask = mini.batch["response_mask"].bool()
        assert (mini.batch["old_log_probs"][mask] == ROLLOUT_LOG_PROB).all() and "rollout_is_weights" not in mini.batch
    assert "compute_log_prob" not in [name for name, _ in calls]
    assert not [key for key in metrics if key.startswith("rollout/logprob_diff")]  # old = rollout: nothing to compare
    assert "actor/entropy" not in metrics  # the stand-in update reports none; the real loss reports the forward's


def test_the_rejection_masks_the_perturbed_rows_of_a_new_batch_and_reports_the_whole_rollout():
    ctx = stand_in_context(LOG_PROBS + ["rollout_correction=decoupled_k3_rs"], [])
    rows, width = 6, 5
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[:, -1] = 0
    rollout = torch.full((rows, width), -1.0)
    old = rollout.clone()
    old[[1, 4]] += 0.5  # these rows' rollout is off-policy: per-token k3 = e^0.5 - 1 - 0.5 = 0.149 > 0.01
    batch = DataProto.from_dict({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask})
    record = StepRecord()
    corrected = record.produce(RolloutCorrection(), ctx, batch, StepState.begin(ctx, stand_in_prompts(), 1))
    kept = corrected.batch["response_mask"].sum(-1).tolist()
    assert kept == [4, 0, 4, 4, 0, 4] and batch.batch["response_mask"].sum().item() == rows * 4  # the input is unchanged
    assert record.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 6)
    assert record.metrics["rollout/logprob_diff_mean"] == pytest.approx(0.5 * 2 / 6)  # before rejection


def test_one_step_off_sends_the_next_generation_before_the_step_trains_and_checkpoints_the_trained_batch():
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(["async_training.mode=one_step_off", "trainer.placement=split"], calls)
    trained = list(TRAINING_MODE_REGISTRY.get("one_step_off")(ctx, BatchSource(StandInLoader()), range(1, 4)))
    sent = [i for i, (name, _) in enumerate(calls) if name == "generate_sequences"]
    synced = [i for i, (name, _) in enumerate(calls) if name == "sync_weights"]
    assert len(sent) == 3 and len(synced) == 3
    # step 2's samples were sent before step 1's weight sync, step 3's after it and before step 2's
    assert sent[1] < synced[0] < sent[2] < synced[1]
    assert [calls[i][1].meta_info[GLOBAL_STEP.name] for i in sent] == [1, 2, 3]  # the seeds of the sync run's steps
    assert [step.metrics["async/staleness/max"] for step in trained] == [0, 1, 1]
    assert [step.loader_state["given"] for step in trained] == [1, 2, 3]  # the loader had given one more each time
    assert all(any(key.startswith("rollout_corr/") for key in step.metrics) for step in trained)  # on by default
