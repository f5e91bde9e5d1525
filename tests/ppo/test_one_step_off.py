"""``async_training.mode=one_step_off`` end to end: real Ray pools (actor, rollout), FSDP2 and vLLM on CPU.

The run's samples are exactly one policy version old after its first step, rollout correction is on
by default, and a checkpoint records the loader position of the batch it trained (the loader has
already given the next one); a resume regenerates that batch with the resumed weights.
"""

from __future__ import annotations

import pytest
import torch

from conftest import base_overrides, read_jsonl, run_main_ppo
from one_line_errors import cli_refusal

BATCHES_PER_EPOCH = 64 // 4  # addition_data's 64 train rows, data.train_batch_size=4


@pytest.mark.timeout(900)
def test_one_step_off_trains_one_version_old_samples_and_resumes_without_repeating_a_batch(tiny_model, addition_data,
                                                                                          tmp_path):
    overrides = base_overrides(tiny_model, addition_data, tmp_path) + [
        "async_training.mode=one_step_off", "trainer.placement=split", "trainer.total_training_steps=3",
        "trainer.save_freq=1", "trainer.test_freq=3"]
    result = run_main_ppo(overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["async/staleness/max"] for r in records] == [0, 1, 1]  # the first step's samples are on-policy
    assert [r["async/policy_version"] for r in records] == [0, 0, 1]
    # rollout correction is on by default; its weights are 1 on the on-policy first step and spread on the stale ones
    spread = [r["rollout_corr/rollout_is_std"] for r in records]
    assert spread[0] < 1e-5 < min(spread[1:]), spread
    assert records[0]["actor/grad_norm"] > 0
    for step in (1, 2):  # the loader gave step+1 batches by then; the checkpoint records step's
        state = torch.load(tmp_path / f"global_step_{step}" / "driver_state.pt", weights_only=True)
        assert divmod(step, BATCHES_PER_EPOCH) == (state["dataloader"]["epoch"], state["dataloader"]["next_batch"])

    resumed = run_main_ppo([o.replace("total_training_steps=3", "total_training_steps=4") for o in overrides])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "(step 3)" in resumed.stderr
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 4
    assert records[-1]["async/staleness/max"] == 0  # the pending generation died with the run: step 4's is sampled anew


def test_an_asynchronous_mode_on_colocated_placement_is_one_line_before_ray(tmp_path):
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", "async_training.mode=one_step_off",
                        f"trainer.ray_temp_dir={tmp_path / 'ray'}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       ray_dir=tmp_path / "ray")
    assert line.startswith("config key 'async_training.mode': one_step_off generates while the trainer trains") and \
        line.endswith("set trainer.placement=split (colocated runs sync)"), line
