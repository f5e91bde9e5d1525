"""``async_training.mode=fully_async`` with stand-in roles (``phases_testlib``).

With a bound of 0 the mode makes the sync run's worker calls in the sync run's order and reports its
metrics; with 1 it sends as ``one_step_off`` does. The property test runs the mode against a stand-in
rollout that behaves as a Ray actor does (one call at a time, in the order sent, on a thread of its own)
and takes a random time per generation call, over random bounds, publication intervals and call
splits: no trained sample is older than the bound, none is trained twice, and a run killed after a
checkpoint and resumed from it trains exactly the samples of the uninterrupted run.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from phases_testlib import StandInLoader, generate_fn, stand_in_context, stand_in_prompts, stand_in_reward

from rlflow.config import ConfigError
from rlflow.trainer.phases.generate import token_version_metrics
from rlflow.trainer.response_scoring import ResponseScorer
from rlflow.trainer.training_modes import TRAINING_MODE_REGISTRY, BatchSource
from rlflow.workers.errors import WorkerDiedError

ASYNC = ["trainer.placement=split"]
VARYING = ("timing_s/", "perf/", "async/")  # wall-clock figures, and the metrics sync mode does not report


def _run(mode: str, overrides: list[str], steps: range) -> tuple[list[str], list[dict[str, float]]]:
    calls: list[tuple[str, Any]] = []
    ctx = stand_in_context(ASYNC + [f"async_training.mode={mode}"] + overrides, calls)
    trained = list(TRAINING_MODE_REGISTRY.get(mode)(ctx, BatchSource(StandInLoader()), steps))
    return [name for name, _ in calls], [step.metrics for step in trained]


def test_a_bound_of_zero_makes_the_sync_runs_calls_and_metrics():
    sync_calls, sync_metrics = _run("sync", ["async_training.rollout_correction=false"], range(1, 4))
    calls, metrics = _run("fully_async", ["async_training.staleness_threshold=0", "async_training.rollout_correction=false"],
                          range(1, 4))
    assert calls == sync_calls
    for ours, theirs in zip(metrics, sync_metrics, strict=True):
        assert ours["async/staleness/max"] == 0 and ours["async/queue_depth"] == 1
        assert {k: v for k, v in ours.items() if not k.startswith(VARYING)} == \
            {k: v for k, v in theirs.items() if not k.startswith(VARYING)}


def test_a_bound_of_one_sends_as_one_step_off_does():
    one_step_off_calls, reference = _run("one_step_off", [], range(1, 5))
    calls, metrics = _run("fully_async", [], range(1, 5))
    assert calls == one_step_off_calls
    assert [m["async/staleness/max"] for m in metrics] == [r["async/staleness/max"] for r in reference] == [0, 1, 1, 1]


def test_weights_are_published_every_trigger_updates_and_after_the_last_step():
    calls, metrics = _run("fully_async", ["async_training.staleness_threshold=2",
                                          "async_training.trigger_parameter_sync_step=3"], range(1, 6))
    assert calls.count("sync_weights") == 2  # after the 3rd update and after the last step
    assert [m["async/staleness/max"] for m in metrics] == [0, 1, 2, 0, 1]


class InOrderRollout:
    """A stand-in rollout actor: its calls run one at a time in the order sent, on a thread of its own; a
    generation call takes a random time and records the weights version that sampled each prompt's samples.
    With ``lives``, it dies after that many generation calls: every call it runs from then on raises
    ``WorkerDiedError``, as a dead Ray actor's calls do."""

    def __init__(self, config: Any, version: int, rng: random.Random, sampled_at: dict[str, int] | None = None,
                 lives: int | None = None):
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.version, self.rng, self.generate = version, rng, generate_fn(config)
        self.sampled_at = {} if sampled_at is None else sampled_at
        self.lives = lives

    def _check_alive(self, method: str) -> None:
        if self.lives is not None and self.lives <= 0:
            raise WorkerDiedError(0, method, "killed", group="rollout")

    def _generation(self, prompts: Any) -> Any:
        self._check_alive("main.generate_sequences")
        if self.lives is not None:
            self.lives -= 1
        time.sleep(self.rng.uniform(0.0, 0.01))  # generation lengths differ from call to call
        output = self.generate(prompts)
        for uid in output.non_tensor_batch["uid"]:
            self.sampled_at[uid] = self.version
        return output

    def future(self, prompts: Any) -> SimpleNamespace:
        return SimpleNamespace(get=self.pool.submit(self._generation, prompts).result)

    def sync_weights(self, rollout_config: Any, version: int) -> dict[str, float]:
        def load() -> dict[str, float]:
            self._check_alive("main.update_weights")
            self.version = version
            return {"weight_sync/mb": 1.0}
        return self.pool.submit(load).result()  # waits for the generation calls sent before it, as Ray does


class RestartingRollout:
    """The rollout side of ``PlacedRoles`` with ``async_training.restart_rollout``, over stand-in pools: each pool
    dies after the next of ``lives`` generation calls, and a dead one is replaced by a new pool holding the
    trainer's weights (``replace_dead_rollout``), also when the death shows in a weight sync."""

    def __init__(self, ctx: Any, version: int, rng: random.Random, lives: list[int]):
        self.ctx, self.rng, self.lives = ctx, rng, list(lives)
        self.sampled_at: dict[str, int] = {}
        ctx.roles.sync_weights = self.sync_weights
        ctx.roles.replace_dead_rollout = self.replace_dead_rollout
        self._start(version)

    def _start(self, version: int) -> None:
        self.pool = InOrderRollout(self.ctx.config, version, self.rng, self.sampled_at,
                                   self.lives.pop(0) if self.lives else None)
        self.ctx.roles.rollout.generate_sequences = self.pool

    def sync_weights(self, rollout_config: Any, version: int) -> dict[str, float]:
        try:
            return self.pool.sync_weights(rollout_config, version)
        except WorkerDiedError as error:
            return self.replace_dead_rollout(error, version)

    def replace_dead_rollout(self, error: WorkerDiedError, version: int) -> dict[str, float]:
        assert error.group == "rollout"
        self.ctx.roles.rollout_restarted_at.append(version)
        self._start(version)
        return self.sync_weights(self.ctx.config.rollout, version)


class NumberedLoader(StandInLoader):
    """Batches whose prompt uids name the batch (``<batch>-<row>``); resumes from a ``state_dict``."""

    def __init__(self, given: int = 0) -> None:
        super().__init__()
        self.given = given

    def __iter__(self):
        while True:
            self.given += 1
            prompts = stand_in_prompts()
            prompts.non_tensor_batch["uid"] = np.array([f"{self.given}-{i}" for i in range(len(prompts))], dtype=object)
            yield prompts


def _trained(overrides: list[str], steps: range, given: int, rng: random.Random,
             lives: list[int] = ()) -> tuple[list[set[str]], Any, list]:
    """Run ``steps``; per step the uids trained; the rollout; the yielded steps. The trainer's version before a
    step is the number of steps before it (GRPO: every step updates). ``lives``: the rollout pool dies after
    that many generation calls, its replacement after the next number, and so on."""
    ctx = stand_in_context(ASYNC + ["async_training.mode=fully_async"] + overrides, [])
    scored: list[set[str]] = []
    rollout = RestartingRollout(ctx, steps[0] - 1, rng, lives)  # a resume loads the checkpoint's weights first

    def recording_reward(batch: Any) -> Any:
        scored.append(set(batch.non_tensor_batch["uid"]))
        return stand_in_reward(batch)

    ctx.scorer = ResponseScorer(recording_reward, ctx.config.reward)
    trained = list(TRAINING_MODE_REGISTRY.get("fully_async")(ctx, BatchSource(NumberedLoader(given)), steps))
    for index, uids in enumerate(scored):
        trainer_version = steps[0] - 1 + index
        bound = ctx.config.async_training.staleness_threshold
        assert all(trainer_version - rollout.sampled_at[uid] <= bound for uid in uids), (index, bound)
    return scored, rollout, trained


def _random_pipeline(rng: random.Random) -> list[str]:
    bound = rng.randint(0, 3)
    return [f"async_training.staleness_threshold={bound}",
            f"async_training.trigger_parameter_sync_step={rng.randint(1, bound + 1)}",
            f"async_training.require_batches={rng.choice([1, 2, 4])}"]


@pytest.mark.parametrize("seed", range(6))
def test_no_sample_is_staler_than_the_bound_none_is_trained_twice_and_a_resume_trains_the_same_samples(seed):
    rng = random.Random(seed)
    overrides = _random_pipeline(rng)
    last, kill_after = 7, rng.randint(1, 6)
    whole, _, _ = _trained(overrides, range(1, last + 1), 0, rng)
    every = [uid for uids in whole for uid in uids]
    assert len(every) == len(set(every)) == last * 4  # each prompt of each batch trained once

    before, _, trained = _trained(overrides, range(1, kill_after + 1), 0, rng)
    checkpoint = trained[-1].loader_state  # what a checkpoint after step ``kill_after`` records
    after, _, _ = _trained(overrides, range(kill_after + 1, last + 1), checkpoint["given"], rng)
    assert set().union(*before, *after) == set(every) and sum(map(len, before + after)) == len(every)


@pytest.mark.parametrize("seed", range(6))
def test_a_rollout_pool_that_dies_is_replaced_and_every_sample_is_still_trained_once_within_the_bound(seed):
    rng = random.Random(100 + seed)
    overrides, last = _random_pipeline(rng), 7
    whole, _, _ = _trained(overrides, range(1, last + 1), 0, rng)
    lives = [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]  # 0: the pool dies on its first call
    restarted, _, trained = _trained(overrides, range(1, last + 1), 0, rng, lives)
    every = [uid for uids in restarted for uid in uids]
    assert len(every) == len(set(every)) and set(every) == set().union(*whole)  # none trained twice, none skipped
    restarts = [step.metrics["async/rollout_restarts"] for step in trained]
    assert restarts == sorted(restarts) and 1 <= restarts[-1] <= len(lives), (lives, restarts)


@pytest.mark.parametrize("override, message", [
    ("async_training.trigger_parameter_sync_step=3", "must be 1..staleness_threshold + 1 (2), got 3"),
    ("async_training.require_batches=3", "must divide data.train_batch_size (4), got 3"),
    ("async_training.partial_rollout=true", "partial rollouts are part of async_training.mode=fully_async, not sync"),
    ("async_training.restart_rollout=true", "restarts a dead rollout pool of an asynchronous mode"),
    ("async_training.mode=fully_async trainer.placement=split async_training.partial_rollout=true "
     "actor.engine.lora.rank=4 rollout.lora_sync=adapter", "rollout.lora_sync=adapter is not supported with it"),
])
def test_async_keys_out_of_range_are_refused_at_composition(override, message):
    with pytest.raises(ConfigError) as refused:
        stand_in_context(override.split(), [])
    assert message in str(refused.value)


def test_token_versions_give_each_samples_oldest_version_and_the_share_resumed_with_newer_weights():
    versions = torch.tensor([[5, 5, 6, -1],  # resumed after a sync: oldest 5
                             [6, 6, -1, -1],
                             [4, -1, 4, 4],  # a tool token (-1) between two model turns
                             [-1, -1, -1, -1]])  # no sampled token: left out
    metrics = token_version_metrics(6, versions)
    assert metrics["async/policy_version"] == 4 and metrics["async/staleness/max"] == 2
    assert metrics["async/staleness/mean"] == pytest.approx((1 + 0 + 2) / 3)
    assert metrics["async/partial_samples"] == pytest.approx(1 / 3)
