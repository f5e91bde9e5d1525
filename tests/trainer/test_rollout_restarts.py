"""``PlacedRoles.replace_dead_rollout`` (``async_training.restart_rollout``) around stand-in worker groups: only the
rollout pool's deaths are replaced, at most ``MAX_ROLLOUT_RESTARTS`` times, each new pool loaded with the actor's
weights as the version asked for; a weight sync or a generation that finds the pool dead goes to the new one.
``tests/faults/test_rollout_restart.py`` kills a real rollout worker in a run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rlflow.trainer.placement import MAX_ROLLOUT_RESTARTS, PlacedRoles, RolloutRestarts
from rlflow.workers.errors import WorkerDiedError

ROLLOUT_CONFIG = SimpleNamespace(lora_sync="merged", lora_rank=0, weight_sync_bucket_mb=64, dtype="float32")


class StandInGroup:
    """A rollout worker group: its ``main`` role loads weights and generates until the group is marked dead."""

    def __init__(self, name: str, number: int):
        self.name, self.number, self.dead, self.shut_down = name, number, False, False
        self.loaded: list[int] = []

    def role(self, name: str) -> SimpleNamespace:
        assert name == "main"
        return SimpleNamespace(group=self, update_weights=self.update_weights, generate_sequences=self.generate_sequences)

    def _alive(self, method: str) -> None:
        if self.dead:
            raise WorkerDiedError(0, method, "killed", group=self.name)

    def update_weights(self, refs: Any, version: int) -> list[dict[str, float]]:
        self._alive("main.update_weights")
        self.loaded.append(version)
        return [{"weight_sync/pool": float(self.number)}]

    def generate_sequences(self, prompts: Any) -> str:
        self._alive("main.generate_sequences")
        return f"{prompts} from pool {self.number}"

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self.shut_down = True


def _roles(restart: bool) -> tuple[PlacedRoles, list[StandInGroup]]:
    started = [StandInGroup("rollout", 0)]

    def start() -> StandInGroup:
        started.append(StandInGroup("rollout", len(started)))
        return started[-1]

    actor = SimpleNamespace(publish_weights=lambda bucket_mb, dtype: ["refs"])
    roles = PlacedRoles(actor=actor, rollout=started[0].role("main"), ref=None, critic=None, reward_model=None,
                        colocated=False, groups=[SimpleNamespace(name="actor"), started[0]],
                        restarts=RolloutRestarts(start, ROLLOUT_CONFIG) if restart else None)
    return roles, started


def test_a_dead_pool_is_replaced_by_one_holding_the_actors_weights_and_the_sync_goes_to_it():
    roles, started = _roles(restart=True)
    started[0].dead = True
    assert roles.sync_weights(ROLLOUT_CONFIG, 5) == {"weight_sync/pool": 1.0}
    assert started[0].shut_down and started[1].loaded == [5] and roles.rollout_restarted_at == [5]
    assert roles.groups[1] is started[1] and roles.rollout.group is started[1]


def test_a_generation_that_finds_the_pool_dead_is_sent_again_to_the_new_pool():
    roles, started = _roles(restart=True)
    started[0].dead = True
    assert roles.generate("prompts", 3) == "prompts from pool 1"
    assert started[1].loaded == [3] and roles.rollout_restarted_at == [3]


def test_restarts_stop_after_the_limit_and_the_last_death_ends_the_run():
    roles, started = _roles(restart=True)
    for restart in range(MAX_ROLLOUT_RESTARTS):
        roles.rollout.group.dead = True
        roles.sync_weights(ROLLOUT_CONFIG, restart)
    roles.rollout.group.dead = True
    with pytest.raises(WorkerDiedError, match="worker rank 0 of worker group 'rollout' died while running"):
        roles.sync_weights(ROLLOUT_CONFIG, 9)
    assert len(started) == MAX_ROLLOUT_RESTARTS + 1 and roles.rollout_restarted_at == list(range(MAX_ROLLOUT_RESTARTS))


def test_without_restarts_or_for_another_groups_death_the_error_ends_the_run():
    roles, started = _roles(restart=False)
    started[0].dead = True
    with pytest.raises(WorkerDiedError, match="of worker group 'rollout'"):
        roles.generate("prompts", 0)
    roles, started = _roles(restart=True)
    with pytest.raises(WorkerDiedError, match="of worker group 'actor'"):
        roles.replace_dead_rollout(WorkerDiedError(1, "main.forward_backward", "killed", group="actor"), 0)
    assert len(started) == 1 and not roles.rollout_restarted_at
