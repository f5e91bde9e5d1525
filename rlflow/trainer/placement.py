"""Place the PPO roles on Ray worker groups.

``colocated`` (the default): one resource pool; every process hosts the fused
``ActorRolloutRef`` (actor engine, rollout replica, optional reference engine) and, for
GAE, a ``Critic``. Weight sync is an in-process copy.

``split``: a pool per role. The rollout pool (``rollout.num_replicas`` processes) receives
the actor's weights through the Ray object store after every update; each of its workers
reserves a device per tensor-parallel shard (``rollout.tensor_parallel_size``). With
``async_training.restart_rollout`` a rollout pool that dies is started again (``RolloutRestarts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from rlflow.models.ensure import check_model_folder
from rlflow.roles.actor import Actor, reference_is_base_model
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.roles.critic import Critic
from rlflow.roles.reference import Reference
from rlflow.roles.reward_model import RewardModel
from rlflow.roles.rollout_worker import RolloutWorker
from rlflow.rollout import syncs_adapters
from rlflow.config import ConfigError
from rlflow.config.loading.engine_checks import check_engine_fits
from rlflow.config.loading.timeouts import group_timeouts, resource_wait_s
from rlflow.utils.registry import Registry
from rlflow.utils.logging import get_logger
from rlflow.workers import RayWorkerGroup, ResourcePool, RoleHandle, WorkerDiedError, WorkerSpec

logger = get_logger(__name__)
MAX_ROLLOUT_RESTARTS = 3  # a pool that keeps dying (out of memory at start, a bad node) ends the run after these


# trainer.placement -> the function that starts its worker groups (config loading checks the key against it).
PLACEMENT_REGISTRY: Registry[Callable[[Any, Path, bool, bool], "PlacedRoles"]] = Registry("placement", "trainer.placement",
                                                                                        error=ConfigError)


@dataclass
class RolloutRestarts:
    """``async_training.restart_rollout``: how to start a split rollout pool again, and how often it may be."""

    start: Callable[[], RayWorkerGroup]
    rollout_config: Any
    limit: int = MAX_ROLLOUT_RESTARTS


@dataclass
class PlacedRoles:
    """The controller's handles on each role, whichever groups host them.

    ``rollout_restarted_at``: the policy version each replacement of a dead rollout pool started with (empty
    unless ``restarts`` is set and a pool died); calls sent to a replaced pool died with it and must be sent again.
    """

    actor: RoleHandle
    rollout: RoleHandle
    ref: Optional[RoleHandle]
    critic: Optional[RoleHandle]
    reward_model: Optional[RoleHandle]
    colocated: bool
    groups: list[RayWorkerGroup] = field(default_factory=list)
    restarts: Optional[RolloutRestarts] = None
    rollout_restarted_at: list[int] = field(default_factory=list)

    def sync_weights(self, rollout_config: Any, version: int) -> dict[str, float]:
        """Push the actor's weights into every rollout replica, in the rollout's dtype (``rollout.dtype``), as policy
        ``version`` (its actor updates; a split replica keeps it for partial rollouts)."""
        if self.colocated:
            return self.actor.sync_weights()[0]
        try:
            if syncs_adapters(rollout_config):
                published = self.actor.publish_lora_adapter(rollout_config.weight_sync_bucket_mb, rollout_config.dtype)[0]
                return self.rollout.update_lora_adapter(published)[0]
            refs = self.actor.publish_weights(rollout_config.weight_sync_bucket_mb, rollout_config.dtype)[0]
            return self.rollout.update_weights(refs, version)[0]
        except WorkerDiedError as error:
            return self.replace_dead_rollout(error, version)

    def sync_weights_live(self, rollout_config: Any, version: int) -> dict[str, float]:
        """Split placement, partial rollouts: push the actor's weights into the rollout replicas while they generate
        (``RolloutWorker.update_weights_live``), as policy ``version``."""
        try:
            refs = self.actor.publish_weights(rollout_config.weight_sync_bucket_mb, rollout_config.dtype)[0]
            return self.rollout.update_weights_live(refs, version)[0]
        except WorkerDiedError as error:
            return self.replace_dead_rollout(error, version)

    def generate(self, prompts: Any, version: int) -> Any:
        """``rollout.generate_sequences(prompts)``, sent again to a new pool if the rollout pool dies (``version``: the
        actor's current policy version, which the new pool starts with)."""
        while True:
            try:
                return self.rollout.generate_sequences(prompts)
            except WorkerDiedError as error:
                self.replace_dead_rollout(error, version)

    def replace_dead_rollout(self, error: WorkerDiedError, version: int) -> dict[str, float]:
        """Start the rollout pool again after ``error`` killed one of its workers, loaded with the actor's current
        weights as policy ``version``; returns that sync's metrics. ``error`` is raised again when it is not the
        rollout pool's, restarts are off, or ``MAX_ROLLOUT_RESTARTS`` are used up."""
        restarts, dead = self.restarts, self.rollout.group
        if restarts is None or error.group != dead.name:
            raise error
        if len(self.rollout_restarted_at) >= restarts.limit:
            logger.error("rollout pool '%s' died again after %d restarts; ending the run", dead.name, restarts.limit)
            raise error
        logger.warning("%s; starting rollout pool '%s' again (restart %d of at most %d, policy version %d)",
                       str(error).splitlines()[0], dead.name, len(self.rollout_restarted_at) + 1, restarts.limit, version)
        dead.shutdown(timeout_s=0.0)  # its live replicas may be mid-generation: no point waiting for them to close
        group = restarts.start()
        self.groups[self.groups.index(dead)] = group
        self.rollout = group.role("main")
        self.rollout_restarted_at.append(version)
        return self.sync_weights(restarts.rollout_config, version)

    def free_rollout_memory(self, rollout_config: Any) -> None:
        """Colocated with ``rollout.free_cache_engine``: put the rollout engines to sleep for the
        training phase (vLLM on GPU frees its weights and KV cache; a no-op on CPU). The next
        ``sync_weights`` wakes them; a split rollout pool has its own devices and is left alone."""
        if self.colocated and rollout_config.free_cache_engine:
            self.rollout.sleep()

    def shutdown(self) -> None:
        for group in reversed(self.groups):
            group.shutdown()


def _pool(trainer_config: Any, name: str, procs_per_node: int, wait_s: Optional[float] = None,
          devices_per_proc: int = 1) -> ResourcePool:
    """A pool of ``procs_per_node`` processes a node, each with ``devices_per_proc`` devices; it waits ``wait_s`` for
    the cluster's resources (default: ``resource_wait_s``)."""
    return ResourcePool(
        procs_per_node=procs_per_node,
        nnodes=trainer_config.nnodes,
        cpus_per_proc=trainer_config.cpus_per_proc,
        device=trainer_config.device,
        resource_wait_s=resource_wait_s(trainer_config) if wait_s is None else wait_s,
        name=name,
        devices_per_proc=devices_per_proc,
    )


def processes_per_node(config: Any) -> int:
    """Worker processes per node every run of ``trainer.placement`` starts: colocated, one per rank; split, the actor's
    and the rollout's pools, a rollout worker counting once per tensor-parallel shard (the reference, critic and
    reward-model pools come on top when the run uses them)."""
    procs = config.trainer.n_procs_per_node
    rollout_procs = (config.rollout.num_replicas or procs) * int(config.rollout.tensor_parallel_size)
    return procs if config.trainer.placement == "colocated" else procs + rollout_procs


def place_roles(config: Any, model_path: Path, use_ref: bool, use_critic: bool) -> PlacedRoles:
    """Start the worker groups ``trainer.placement`` (checked in config loading) asks for."""
    return PLACEMENT_REGISTRY.get(config.trainer.placement)(config, model_path, use_ref, use_critic)


def _reward_model_spec(config: Any, model_path: Path) -> Optional[WorkerSpec]:
    reward_model = config.reward.reward_model
    if not reward_model.enable:
        return None
    return WorkerSpec(RewardModel, reward_model, reward_model.path or str(model_path))


def check_role_model_folders(config: Any, use_critic: bool) -> None:
    """Check the critic's and the reward model's own folders (where set and used) before Ray starts."""
    folders = {
        "critic.model.path": config.critic.model.path if use_critic else None,
        "reward.reward_model.path": config.reward.reward_model.path if config.reward.reward_model.enable else None,
    }
    for key, path in folders.items():
        if path:
            check_model_folder(key, path)


def check_role_engines(config: Any, model_path: Path, use_ref: bool, use_critic: bool, world_size: int) -> None:
    """Each role's engine can run its model on the ``world_size`` worker processes (``check_engine_fits``), before Ray."""
    reward_model = config.reward.reward_model
    roles = {  # engine mount -> (model folder, model kind), for the roles this run builds
        "actor.engine": (model_path, "causal_lm"),
        "ref.engine": (model_path, "causal_lm") if use_ref and not reference_is_base_model(config.actor) else None,
        "critic.engine": (config.critic.model.path or model_path, "value") if use_critic else None,
        "reward.reward_model.engine": (reward_model.path or model_path, "value") if reward_model.enable else None,
    }
    for mount, role in roles.items():
        if role is not None:
            check_engine_fits(config, mount, *role, world_size)


def _critic_spec(config: Any, model_path: Path) -> WorkerSpec:
    """The critic from ``critic.model.path``, or from the actor's model folder when that is null."""
    return WorkerSpec(Critic, config.critic, config.critic.model.path or str(model_path))


@PLACEMENT_REGISTRY.register("colocated")
def _place_colocated(config: Any, model_path: Path, use_ref: bool, use_critic: bool) -> PlacedRoles:
    optional = {
        "critic": _critic_spec(config, model_path) if use_critic else None,
        "reward_model": _reward_model_spec(config, model_path),
    }
    workers = {
        "actor": WorkerSpec(ActorRolloutRef, config.actor, config.rollout, str(model_path), config.ref if use_ref else None),
        **{role: spec for role, spec in optional.items() if spec is not None},
    }
    group = RayWorkerGroup(_pool(config.trainer, "colocated", config.trainer.n_procs_per_node), workers, name="colocated",
                           timeouts=group_timeouts(config.trainer.timeouts))
    actor = group.role("actor")
    hosted = {role: group.role(role) if role in workers else None for role in optional}
    return PlacedRoles(actor, actor, actor if use_ref else None, hosted["critic"], hosted["reward_model"],
                       colocated=True, groups=[group])


@PLACEMENT_REGISTRY.register("split")
def _place_split(config: Any, model_path: Path, use_ref: bool, use_critic: bool) -> PlacedRoles:
    groups = []

    def group(name: str, spec: WorkerSpec, procs: int, wait_s: Optional[float] = None, devices: int = 1) -> RayWorkerGroup:
        return RayWorkerGroup(_pool(config.trainer, name, procs, wait_s, devices), spec, name=name,
                              timeouts=group_timeouts(config.trainer.timeouts))

    def start(name: str, spec: WorkerSpec, procs: int, devices: int = 1) -> RoleHandle:
        groups.append(group(name, spec, procs, devices=devices))
        return groups[-1].role("main")

    procs = config.trainer.n_procs_per_node
    rollout_spec = WorkerSpec(RolloutWorker, config.rollout, str(model_path))
    rollout_procs = config.rollout.num_replicas or procs
    shards = int(config.rollout.tensor_parallel_size)  # each rollout worker's engine: a device per shard
    restart_wait_s = float(config.trainer.timeouts.connect_s)  # until Ray frees the dead pool's resources
    restarts = RolloutRestarts(lambda: group("rollout", rollout_spec, rollout_procs, restart_wait_s, shards),
                               config.rollout) if config.async_training.restart_rollout else None
    try:
        actor = start("actor", WorkerSpec(Actor, config.actor, str(model_path)), procs)
        rollout = start("rollout", rollout_spec, rollout_procs, devices=shards)
        ref = None
        if use_ref and reference_is_base_model(config.actor):
            ref = actor  # a LoRA actor is its own reference (its base model): no second copy of the model
        elif use_ref:
            ref = start("ref", WorkerSpec(Reference, config.ref, str(model_path)), procs)
        critic = start("critic", _critic_spec(config, model_path), procs) if use_critic else None
        reward_spec = _reward_model_spec(config, model_path)
        reward_model = start("reward_model", reward_spec, procs) if reward_spec else None
    except BaseException:
        for group in reversed(groups):
            group.shutdown()
        raise
    return PlacedRoles(actor, rollout, ref, critic, reward_model, colocated=False, groups=groups, restarts=restarts)

