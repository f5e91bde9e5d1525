"""``ResourcePool``: Ray placement groups reserving one bundle per worker process.

A bundle is ``{"CPU": c}`` on CPU or ``{"GPU": 1, "CPU": c}`` with an accelerator (``d`` devices and ``c x d``
CPUs for a worker of ``devices_per_proc=d``). The pool spans
``nnodes x procs_per_node`` bundles. Placements (``POOL_PLACEMENT_REGISTRY``):

* ``pack`` (default): one STRICT_PACK placement group per node, each pinned away from the nodes
  already used, so every node hosts exactly ``procs_per_node`` workers;
* ``spread``: one SPREAD placement group over all bundles (best-effort spreading).

Before reserving anything the request is compared with the cluster's free and per-node
resources; a request that cannot fit (after waiting up to ``resource_wait_s`` for the cluster to
offer it: nodes of a joined cluster may still be coming up) raises ``ResourceUnavailableError``
naming what is missing, and a group that still does not become ready within ``ready_timeout_s``
raises it too (instead of pending forever).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlflow.utils.device import ray_resource_name
from rlflow.utils.logging import get_logger
from rlflow.utils.registry import Registry, UnknownNameError
from rlflow.workers.errors import ResourceUnavailableError

logger = get_logger(__name__)
POOL_PLACEMENT_REGISTRY: Registry[Callable[["ResourcePool"], None]] = Registry("pool placement")

_NODE_ID_LABEL = "ray.io/node-id"
_EPS = 1e-9
_POLL_S = 1.0  # how often a pool waiting for resources looks at the cluster again


@dataclass(frozen=True)
class BundleSlot:
    """One reserved bundle: where a worker of the given rank will run."""

    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    local_rank: int


class ResourcePool:
    """Reserves ``nnodes x procs_per_node`` bundles on the Ray cluster for one worker group.

    ``device``: ``"cpu"``, an accelerator type, or ``"auto"`` (an accelerator bundle when the
    cluster has GPUs). Workers run ``max(1, int(cpus_per_proc))`` torch threads. A worker that starts processes of
    its own, one per device (a tensor-parallel rollout engine's shards), takes ``devices_per_proc`` devices and
    ``devices_per_proc x cpus_per_proc`` CPUs.
    """

    def __init__(
        self,
        procs_per_node: int,
        nnodes: int = 1,
        cpus_per_proc: float = 1.0,
        device: str = "auto",
        placement: str = "pack",
        ready_timeout_s: float = 60.0,
        resource_wait_s: float = 0.0,
        name: str = "pool",
        devices_per_proc: int = 1,
    ):
        if procs_per_node < 1 or nnodes < 1 or cpus_per_proc <= 0 or devices_per_proc < 1:
            raise ValueError(
                f"ResourcePool '{name}': need procs_per_node >= 1, nnodes >= 1, cpus_per_proc > 0, devices_per_proc >= 1; "
                f"got {procs_per_node}, {nnodes}, {cpus_per_proc}, {devices_per_proc}"
            )
        if placement not in POOL_PLACEMENT_REGISTRY:
            raise UnknownNameError(f"ResourcePool '{name}': {POOL_PLACEMENT_REGISTRY.unknown_message(placement)}")
        if not ray.is_initialized():
            raise RuntimeError("ResourcePool needs a running Ray session; call rlflow.workers.init_ray() first")
        self.name = name
        self.procs_per_node = procs_per_node
        self.nnodes = nnodes
        self.cpus_per_proc = cpus_per_proc
        self.device = device
        self.placement = placement
        self.ready_timeout_s = ready_timeout_s
        self.resource_wait_s = resource_wait_s
        self.accelerator = _accelerator_resource(device)
        self.bundle: dict[str, float] = {"CPU": float(cpus_per_proc) * devices_per_proc}
        if self.accelerator:
            self.bundle[self.accelerator] = float(devices_per_proc)
        self._owner: str | None = None
        self._check_cluster_total()
        self._groups: list[PlacementGroup] = []
        POOL_PLACEMENT_REGISTRY.get(placement)(self)
        self.slots = _slots_in_node_order(self._groups)
        logger.info("pool '%s': %d x %s on %d node(s)", name, self.world_size, self.bundle, len(self.node_ids()))

    @property
    def world_size(self) -> int:
        return self.nnodes * self.procs_per_node

    @property
    def num_threads(self) -> int:
        return max(1, int(self.cpus_per_proc))

    def describe(self) -> str:
        return f"ResourcePool '{self.name}' ({self.nnodes} node(s) x {self.procs_per_node} proc(s) x {self.bundle})"

    def node_ids(self) -> list[str]:
        """The distinct nodes the pool landed on, in rank order."""
        return list(dict.fromkeys(slot.node_id for slot in self.slots))

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Ray actor options that put a worker of ``rank`` in its bundle."""
        slot = self.slots[rank]
        options: dict[str, Any] = {
            "num_cpus": self.bundle["CPU"],
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
            ),
        }
        if self.accelerator:
            options["num_gpus"] = self.bundle[self.accelerator]
        return options

    def claim(self, owner: str) -> None:
        """Mark the pool as hosting ``owner``'s workers (one group per pool; colocate roles instead)."""
        if self._owner is not None:
            raise RuntimeError(
                f"{self.describe()} already hosts worker group '{self._owner}'; give '{owner}' its own pool, "
                "or colocate both roles in one group (RayWorkerGroup(pool, {'a': ..., 'b': ...}))"
            )
        if not self._groups:
            raise RuntimeError(f"{self.describe()} was released; create a new pool")
        self._owner = owner

    def release(self) -> None:
        """Remove the placement groups (idempotent)."""
        for group in self._groups:
            try:
                remove_placement_group(group)
            except Exception as exc:  # already gone with the cluster: nothing left to free
                logger.warning("pool '%s': removing a placement group failed: %s", self.name, exc)
        self._groups = []
        self._owner = None

    # ------------------------------------------------------------------ reservation
    def _check_cluster_total(self) -> None:
        need = {key: value * self.world_size for key, value in self.bundle.items()}
        deadline = time.monotonic() + self.resource_wait_s
        while True:
            free = _free(self.bundle)
            missing = {key: round(n - free[key], 6) for key, n in need.items() if n > free[key] + _EPS}
            if not missing:
                return
            if time.monotonic() >= deadline:
                waited = f" (after waiting {self.resource_wait_s:.0f} s)" if self.resource_wait_s else ""
                raise ResourceUnavailableError(
                    f"{self.describe()} needs {need} in total but the cluster has {free} free{waited}: missing {missing}. "
                    "Lower nnodes / procs_per_node / cpus_per_proc, free resources, or add nodes."
                )
            time.sleep(_POLL_S)

    def _reserve(self, bundles: list[dict[str, float]], strategy: str, label: str, selector: list | None = None) -> str:
        """Create one placement group and wait (bounded) until it is placed; returns its first node."""
        group = placement_group(bundles, strategy=strategy, name=f"{self.name}_{label}", bundle_label_selector=selector)
        self._groups.append(group)
        try:
            ray.get(group.ready(), timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            message = (
                f"{self.describe()}: placement group '{label}' ({len(bundles)} x {bundles[0]}, {strategy}) was not "
                f"placed within {self.ready_timeout_s:.0f} s. Free now: {_free(self.bundle)}; node totals: "
                f"{_node_totals(self.bundle)}. Another job may hold the resources, or no node has enough free."
            )
            self.release()
            raise ResourceUnavailableError(message) from None
        return placement_group_table(group)["bundles_to_node_id"][0]


def _accelerator_resource(device: str) -> str | None:
    """The Ray resource a bundle reserves for ``device`` (``auto`` uses one only if the cluster has it)."""
    name = ray_resource_name(device)
    if device == "auto" and name is not None and ray.cluster_resources().get(name, 0) <= 0:
        return None
    return name


def _alive_nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def _node_totals(bundle: dict[str, float]) -> dict[str, dict[str, float]]:
    return {node["NodeID"][:8]: {k: node["Resources"].get(k, 0.0) for k in bundle} for node in _alive_nodes()}


def _free(bundle: dict[str, float]) -> dict[str, float]:
    available = ray.available_resources()
    return {k: available.get(k, 0.0) for k in bundle}


@POOL_PLACEMENT_REGISTRY.register("pack")
def _place_pack(pool: ResourcePool) -> None:
    per_node = {key: value * pool.procs_per_node for key, value in pool.bundle.items()}
    large_enough = [
        node for node in _alive_nodes() if all(node["Resources"].get(k, 0.0) + _EPS >= v for k, v in per_node.items())
    ]
    if len(large_enough) < pool.nnodes:
        raise ResourceUnavailableError(
            f"{pool.describe()} needs {pool.nnodes} node(s) that each hold {per_node}, but only "
            f"{len(large_enough)} node(s) are that large. Node totals: {_node_totals(pool.bundle)}. "
            "Lower procs_per_node or cpus_per_proc, use placement='spread', or add nodes."
        )
    used: list[str] = []
    for index in range(pool.nnodes):
        selector = [{_NODE_ID_LABEL: f"!in({','.join(used)})"}] * pool.procs_per_node if used else None
        used.append(pool._reserve([dict(pool.bundle)] * pool.procs_per_node, "STRICT_PACK", f"node{index}", selector))


@POOL_PLACEMENT_REGISTRY.register("spread")
def _place_spread(pool: ResourcePool) -> None:
    pool._reserve([dict(pool.bundle)] * pool.world_size, "SPREAD", "spread")


def _slots_in_node_order(groups: list[PlacementGroup]) -> list[BundleSlot]:
    """Bundles ordered so that ranks on one node are contiguous; local rank counts within a node."""
    placed = []
    for group in groups:
        node_of = placement_group_table(group)["bundles_to_node_id"]
        placed += [(group, index, node_of[index]) for index in range(group.bundle_count)]
    node_order = {node: i for i, node in enumerate(dict.fromkeys(node for _, _, node in placed))}
    placed.sort(key=lambda item: node_order[item[2]])  # stable: bundle order kept within a node
    slots, seen = [], {}
    for group, index, node in placed:
        local_rank = seen.get(node, 0)
        seen[node] = local_rank + 1
        slots.append(BundleSlot(group, index, node, local_rank))
    return slots
