"""``async_training.mode=fully_async`` end to end: real Ray pools (actor, rollout), FSDP2 and the HF rollout on CPU.

With a staleness bound of 0 the mode must train exactly as the sync run on the same split placement does:
the same ``metrics.jsonl`` at the same seed, wall-clock figures and the ``async/*`` metrics aside.
"""

from __future__ import annotations

import math

import pytest

from conftest import base_overrides, comparable, read_jsonl, run_main_ppo

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

