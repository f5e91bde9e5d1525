"""Old log-probs from the update's own forward when the step is exactly on-policy.

The rule is unit-tested on composed configs; the acceptance test runs the same seeded GRPO run
twice at world size 2 (mesh dispatch splits and collects the update's outputs), once reusing the
update's forward and once with ``actor.recompute_old_log_probs=always``, and compares every
metric, the timings of the skipped pass and the exported weights.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import base_overrides, comparable, compose_ppo, read_jsonl, run_main_ppo
from rlflow.protocol import DataProto
from rlflow.trainer.old_log_probs import in_batch_order, recompute_reason

ON_POLICY = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4"]
TOLERANCE = 1e-6


def _reason(tiny_model, addition_data, tmp_path, extra: list[str]):
    config = compose_ppo(base_overrides(tiny_model, addition_data, tmp_path) + ON_POLICY + extra)
    return recompute_reason(config, tiny_model)


@pytest.mark.parametrize(
    "extra, reason_part",
    [
        ([], None),
        (["actor.ppo_epochs=2"], "actor.ppo_epochs"),
        (["actor.ppo_mini_batch_size=2"], "actor.ppo_mini_batch_size"),
        (["algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
        (["actor.recompute_old_log_probs=always"], "recompute_old_log_probs=always"),
        (["actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "algorithm=ppo", "critic.ppo_mini_batch_size=2"], None),
        (["rollout.calculate_log_probs=true"], None),  # the off-policy metrics alone are computed after the update
        (["rollout.calculate_log_probs=true", "rollout_correction=decoupled_token_is"], None),  # weights in the loss
        (["rollout.calculate_log_probs=true", "rollout_correction=decoupled_seq_is"], None),
        (["rollout.calculate_log_probs=true", "rollout_correction=decoupled_seq_is_rs"], "rejection"),
        (["rollout.calculate_log_probs=true", "rollout_correction=decoupled_token_is",
          "algorithm.rollout_correction.rollout_is_batch_normalize=true"], "batch-normalized"),
        (["rollout.calculate_log_probs=true", "rollout_correction=bypass_ppo_clip"], "the old log-probs are the rollout's"),
    ],
    ids=["on_policy", "two_epochs", "two_mini_batches", "kl_in_reward", "forced", "kl_loss_entropy_critic",
         "rollout_log_probs", "token_is", "sequence_is", "rejection", "batch_normalized", "bypass"],
)
def test_when_the_update_forward_gives_the_old_log_probs(tiny_model, addition_data, tmp_path, extra, reason_part):
    reason = _reason(tiny_model, addition_data, tmp_path, extra)
    assert reason is None if reason_part is None else reason_part in reason, reason


def test_a_model_with_dropout_recomputes(tiny_model, addition_data, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    model_config = json.loads((tiny_model / "config.json").read_text())
    model_config.update(attention_dropout=0.1, text_config={"resid_pdrop": 0.2})
    (model / "config.json").write_text(json.dumps(model_config))
    config = compose_ppo(base_overrides(tiny_model, addition_data, tmp_path) + ON_POLICY)
    reason = recompute_reason(config, model)
    assert "attention_dropout=0.1" in reason and "text_config.resid_pdrop=0.2" in reason, reason


def test_outputs_go_back_in_batch_row_order():
    rows = torch.tensor([2, 0, 3, 1])
    outputs = DataProto.from_dict({"log_probs": rows.float().unsqueeze(-1).expand(4, 3).clone()})
    assert in_batch_order(outputs, rows).batch["log_probs"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def _close(reused: float, recomputed: float) -> bool:
    return math.isclose(reused, recomputed, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _compare_reuse_with_recompute(tiny_model, addition_data, tmp_path, extra: list[str]) -> list[dict]:
    """The same seeded run with ``recompute_old_log_probs`` auto and always: every metric within the tolerance,
    ``ppo_kl`` exactly 0 and no old-log-prob pass on the reuse path, the exported weights within 1e-6."""
    runs = {}
    for mode in ("auto", "always"):
        overrides = [o for o in base_overrides(tiny_model, addition_data, tmp_path / mode) if not o.startswith("data.val_files")]
        result = run_main_ppo(overrides + ON_POLICY + [
            "data.val_files=[]",  # no validation: the comparison is of the training steps
            f"actor.recompute_old_log_probs={mode}",
            "rollout=hf",  # starts faster than vLLM; the rollout is not what is compared
            "trainer.total_training_steps=2",
            "actor.engine.optimizer.lr=1e-3",
        ] + extra)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[mode] = read_jsonl(tmp_path / mode / "metrics.jsonl")
        logged = "from the update's forward" if mode == "auto" else "a separate forward pass"
        assert f"old log-probs: {logged}" in result.stdout + result.stderr

    for reused, recomputed in zip(runs["auto"], runs["always"], strict=True):
        assert reused["actor/ppo_kl"] == 0.0  # ratio exactly 1: no separate pass to differ from
        assert abs(recomputed["actor/ppo_kl"]) < TOLERANCE
        assert reused["timing_s/log_probs_and_values"] < 1e-3 < recomputed["timing_s/log_probs_and_values"]
        assert reused["actor/grad_norm"] > 0 and reused["rollout/logprob_diff_max"] > 0  # real values compared
        left, right = comparable(reused), comparable(recomputed)
        assert left.keys() == right.keys()
        differ = {key: (left[key], right[key]) for key in left
                  if key != "actor/ppo_kl" and not _close(float(left[key]), float(right[key]))}
        assert not differ, differ

    reused_weights = load_file(tmp_path / "auto" / "hf" / "model.safetensors")
    recomputed_weights = load_file(tmp_path / "always" / "hf" / "model.safetensors")
    assert reused_weights.keys() == recomputed_weights.keys()
    for name, tensor in reused_weights.items():
        torch.testing.assert_close(tensor, recomputed_weights[name], rtol=0, atol=1e-6, msg=name)
    return runs["auto"]


@pytest.mark.timeout(900)
def test_reusing_the_update_forward_matches_the_recompute(tiny_model, addition_data, tmp_path):
    """World size 2 (mesh dispatch splits and collects the update's outputs); the mismatch metrics are computed
    with the old log-probs of either source."""
    _compare_reuse_with_recompute(tiny_model, addition_data, tmp_path,
                                  ["trainer.n_procs_per_node=2", "rollout.calculate_log_probs=true"])


@pytest.mark.full
@pytest.mark.timeout(900)
def test_is_weights_in_the_update_loss_match_the_rollout_correction_phase(tiny_model, addition_data, tmp_path):
    """One step off (stale samples, so the weights are not 1) with token TIS, the asynchronous default: the loss's
    weights from the update forward train as the rollout-correction phase's weights from a separate pass do."""
    records = _compare_reuse_with_recompute(tiny_model, addition_data, tmp_path, [
        "async_training.mode=one_step_off", "trainer.placement=split", "rollout_correction=decoupled_token_is",
        "algorithm.rollout_correction.rollout_is_threshold=1.001", "rollout.calculate_log_probs=true"])
    assert records[-1]["async/staleness/max"] == 1
    assert records[-1]["rollout_corr/rollout_is_std"] > 1e-5  # the stale step's weights differ from 1
