"""``async_training.mode=fully_async`` end to end: real Ray pools (actor, rollout), FSDP2, the HF and vLLM rollouts on CPU.

With a staleness bound of 0 the mode must train exactly as the sync run on the same split placement does:
the same ``metrics.jsonl`` at the same seed, wall-clock figures and the ``async/*`` metrics aside. An agent-loop
run (the tool task) trains with partial rollouts.
"""

from __future__ import annotations

import math

import pytest

from conftest import base_overrides, comparable, read_jsonl, run_main_ppo

from rlflow.data.tasks import build_task, write_task_files

TOLERANCE = 1e-6
SAME_RUN = ["trainer.placement=split", "rollout=hf", "trainer.total_training_steps=2", "data.val_files=[]",
            "rollout.calculate_log_probs=true", "rollout_correction=decoupled_token_is"]


@pytest.mark.timeout(900)
def test_a_staleness_bound_of_zero_trains_as_the_sync_split_run(tiny_model, addition_data, tmp_path):
    runs = {}
    for name, mode in (("sync", ["async_training.mode=sync"]),
                       ("fully_async", ["async_training.mode=fully_async", "async_training.staleness_threshold=0"])):
        overrides = [o for o in base_overrides(tiny_model, addition_data, tmp_path / name) if not o.startswith("data.val_files")]
        result = run_main_ppo(overrides + SAME_RUN + mode)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = read_jsonl(tmp_path / name / "metrics.jsonl")
    assert [r["async/staleness/max"] for r in runs["fully_async"]] == [0, 0]
    for ours, theirs in zip(runs["fully_async"], runs["sync"], strict=True):
        left = {k: v for k, v in comparable(ours).items() if not k.startswith("async/")}
        right = comparable(theirs)
        assert left.keys() == right.keys()
        assert right["actor/grad_norm"] > 0 and right["rollout_corr/rollout_is_mean"] > 0  # real values compared
        differ = {k: (left[k], right[k]) for k in left
                  if not math.isclose(float(left[k]), float(right[k]), rel_tol=TOLERANCE, abs_tol=TOLERANCE)}
        assert not differ, differ



@pytest.fixture(scope="module")
def tool_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "tool_product"
    write_task_files(build_task("tool_product", digits=2, operands=3), out, n_train=64, n_val=8, seed=0)
    return out


REPLACED = ("data.val_files", "data.train_batch_size", "data.max_response_length", "actor.ppo_mini_batch_size",
            "rollout.n")


@pytest.mark.full
@pytest.mark.timeout(900)
def test_an_agent_loop_run_trains_fully_async_with_partial_rollouts(tiny_model, tool_data, tmp_path):
    """The tool task's tool_agent loop on vLLM (the dense test reward: the untrained model never answers right),
    two steps of staleness, so the rollout always has trajectories of later steps to generate: weight syncs reach
    it mid-generation, and the requests in flight resume with the new weights."""
    overrides = [o for o in base_overrides(tiny_model, tool_data, tmp_path) if not o.startswith(REPLACED)] + [
        "async_training.mode=fully_async", "trainer.placement=split", "async_training.partial_rollout=true",
        "async_training.staleness_threshold=2",
        "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator]",
        "rollout.multi_turn.max_assistant_turns=3", "data.val_files=[]", "data.max_response_length=96",
        "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=8", "trainer.total_training_steps=5"]
    result = run_main_ppo(overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 5 and all(r["actor/grad_norm"] > 0 for r in records)
    assert [r["async/staleness/max"] <= 2 for r in records] == [True] * 5
    assert records[0]["async/staleness/max"] == 0  # the first step's samples come from the starting weights
    resumed = [r["async/partial_samples"] for r in records]
    assert max(resumed) > 0, resumed  # some trajectories were resumed with newer weights mid-generation
    assert all(r["num_turns"] >= 1 for r in records)
