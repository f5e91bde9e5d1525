"""``rollout.free_cache_engine``: the driver sleeps a colocated engine for training and the weight sync
wakes it. Stand-ins count the calls (no GPU vLLM here); on CPU the real engine's sleep is a no-op,
which ``test_rollout_groups`` exercises (it sleeps the colocated replicas before their sync)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlflow.rollout.vllm_rollout import VLLMRollout
from rlflow.trainer.placement import PlacedRoles


class CountingRolloutGroup:
    """Stands in for the rollout ``RoleHandle``: counts ``sleep`` calls."""

    def __init__(self):
        self.sleeps = 0

    def sleep(self) -> None:
        self.sleeps += 1


def _roles(colocated: bool) -> PlacedRoles:
    group = CountingRolloutGroup()
    return PlacedRoles(actor=group, rollout=group, ref=None, critic=None, reward_model=None, colocated=colocated)


def test_colocated_engine_sleeps_only_when_free_cache_engine_is_on():
    roles = _roles(colocated=True)
    roles.free_rollout_memory(SimpleNamespace(free_cache_engine=True))
    assert roles.rollout.sleeps == 1
    roles.free_rollout_memory(SimpleNamespace(free_cache_engine=False))
    assert roles.rollout.sleeps == 1


def test_split_rollout_pool_is_never_put_to_sleep():
    roles = _roles(colocated=False)
    roles.free_rollout_memory(SimpleNamespace(free_cache_engine=True))
    assert roles.rollout.sleeps == 0


class RecordingLLM:
    """Stands in for ``vllm.LLM``: records the lifecycle calls in order."""

    def __init__(self):
        self.calls: list[str] = []

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None) -> None:
        self.calls.append("wake:" + ",".join(tags or ["all"]))

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.calls.append(f"{method}:{len(list(kwargs['weights_iterator']))}")

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")


def _gpu_rollout_with(llm: RecordingLLM) -> VLLMRollout:
    rollout = VLLMRollout.__new__(VLLMRollout)  # the lifecycle logic only, around a stand-in engine
    rollout.config = SimpleNamespace(weight_sync_bucket_mb=1.0)
    rollout.device, rollout._on_cpu, rollout._llm = torch.device("cpu"), False, llm
    rollout._sleep_enabled, rollout._asleep, rollout._shards = True, False, 1
    return rollout


def test_sync_after_sleep_wakes_weights_loads_then_wakes_kv_cache():
    llm = RecordingLLM()
    rollout = _gpu_rollout_with(llm)
    rollout.sleep()
    rollout.sleep()  # idempotent
    rollout._load_weights([("a", torch.zeros(2)), ("b", torch.ones(3))])
    assert llm.calls == ["sleep1", "wake:weights", "reload_weights:2", "reset_prefix_cache", "wake:kv_cache"]
    assert not rollout._asleep


def test_sync_while_awake_does_not_touch_sleep_state():
    llm = RecordingLLM()
    _gpu_rollout_with(llm)._load_weights([("a", torch.zeros(2))])
    assert llm.calls == ["reload_weights:1", "reset_prefix_cache"]
