"""``RayWorkerGroup``: one Ray actor per bundle, driven from the controller as if it were one object.

A group hosts one role (``RayWorkerGroup(pool, WorkerSpec(ActorWorker, cfg))``) or several
colocated roles sharing each process (``RayWorkerGroup(pool, {"actor": ..., "rollout": ...})``).
Each role's ``@register``-ed methods appear on its ``RoleHandle`` (``wg.actor.compute_log_prob``);
a single-role group forwards them, so ``wg.compute_log_prob`` works too.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from typing import Any, Mapping, Sequence

import ray

from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.utils.logging import get_logger
from rlflow.utils.plugins import loaded_plugins
from rlflow.utils.tensor_wire import borrowing_store_buffers
from rlflow.workers.call_limits import CallLimit, GroupTimeouts
from rlflow.workers.decorator import CONCURRENT_GROUP, MethodSpec, registered_methods
from rlflow.workers.dispatch import ONE_TO_ALL, RANK_ZERO, DispatchContext, get_dispatch_mode
from rlflow.workers.errors import WorkerDiedError, WorkerError, WorkerTimeoutError, worker_error_from
from rlflow.workers.host import WorkerHost, WorkerInfo
from rlflow.workers.mesh import MeshTable
from rlflow.workers.resource_pool import ResourcePool

logger = get_logger(__name__)

# Errors meaning the worker process (or its node) is gone, not that the method raised.
_DEATH_ERRORS = (
    ray.exceptions.RayActorError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
)
_PLAIN_VALUES = (int, float, str, bool, bytes, type(None))
_SINGLE_ROLE = "main"
NO_LIMIT = CallLimit(None)


class WorkerSpec:
    """A worker class and the arguments each rank builds it with: ``WorkerSpec(ActorWorker, cfg, seed=1)``."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        if not isinstance(cls, type):
            raise TypeError(f"WorkerSpec needs a class, got {type(cls).__name__}")
        self.cls, self.args, self.kwargs = cls, args, kwargs


def gather(refs: Mapping[int, ray.ObjectRef], method: str, limit: CallLimit = NO_LIMIT, group: str | None = None) -> dict[int, Any]:
    """Wait for per-rank results; the first failure raises at once as WorkerError / WorkerDiedError.

    Past ``limit.timeout_s`` it raises ``WorkerTimeoutError`` naming the phase, ``method`` and
    the ranks still running (``group``: the worker group's name, for the message).
    """
    pending = {ref: rank for rank, ref in refs.items()}
    results: dict[int, Any] = {}
    timeout_s = limit.timeout_s
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
        if not ready:
            raise WorkerTimeoutError(method, sorted(pending.values()), timeout_s, limit.phase, limit.config_key, group)
        for ref in ready:
            rank = pending.pop(ref)
            results[rank] = _fetch(ref, rank, method, group)
    return results


def _fetch(ref: ray.ObjectRef, rank: int, method: str, group: str | None) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, WorkerError):
            raise err.cause from None
        raise worker_error_from(err.cause, rank, method, str(err)) from None
    except _DEATH_ERRORS as err:
        raise WorkerDiedError(rank, method, str(err), group) from None


def _in_order(results: dict[int, Any], ranks: list[int]) -> list[Any]:
    return [results[rank] for rank in ranks]


def _resolve_future(value: Any) -> Any:
    return value.get() if isinstance(value, DataProtoFuture) else value


def owned_outputs(value: Any) -> Any:
    """``value`` with every DataProto in it (also inside plain lists, tuples and dict values)
    holding its own memory rather than views on Ray's object store (``DataProto.owned``)."""
    if isinstance(value, DataProto):
        return value.owned()
    if type(value) in (list, tuple):
        return type(value)(owned_outputs(item) for item in value)
    if type(value) is dict:
        return {key: owned_outputs(item) for key, item in value.items()}
    return value


class GroupMethod:
    """A ``@register``-ed worker method seen from the controller: dispatch, execute, collect.

    Calling it blocks and returns the collected result (or a ``DataProtoFuture`` when the method
    was registered with ``blocking=False``); ``.future(...)`` always returns the future.
    """

    def __init__(self, handle: "RoleHandle", spec: MethodSpec, fn: Any):
        functools.update_wrapper(self, fn)
        self._handle, self.spec = handle, spec

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        future = self._handle.submit(self.spec, args, kwargs)
        return future.get() if self.spec.blocking else future

    def future(self, *args: Any, **kwargs: Any) -> DataProtoFuture:
        return self._handle.submit(self.spec, args, kwargs)


class RoleHandle:
    """One role of a worker group: its registered methods plus ``execute_*`` for any public method."""

    def __init__(self, group: "RayWorkerGroup", role: str, worker_cls: type):
        self._group, self.role, self.worker_cls = group, role, worker_cls
        for name, spec in registered_methods(worker_cls).items():
            if hasattr(self, name):
                raise ValueError(f"{worker_cls.__name__}.{name} clashes with RoleHandle.{name}; rename the method")
            get_dispatch_mode(spec.dispatch_mode)  # an unknown mode fails here, at group creation
            setattr(self, name, GroupMethod(self, spec, getattr(worker_cls, name)))

    @property
    def world_size(self) -> int:
        return self._group.world_size

    @property
    def group(self) -> "RayWorkerGroup":
        """The worker group whose processes host this role."""
        return self._group

    def submit(self, spec: MethodSpec, args: tuple, kwargs: dict) -> DataProtoFuture:
        """Dispatch one call by ``spec``'s mode and return the future of its collected result."""
        args = tuple(_resolve_future(a) for a in args)
        kwargs = {k: _resolve_future(v) for k, v in kwargs.items()}
        mode = get_dispatch_mode(spec.dispatch_mode)
        label = f"{self.role}.{spec.name}"
        ctx = DispatchContext(label, self.world_size, spec.mesh, spec.reduce, self._group.mesh_table)
        calls = mode.dispatch(ctx, args, kwargs)
        bad = sorted(rank for rank in calls if not 0 <= rank < self.world_size)
        if bad:
            raise ValueError(f"dispatch mode '{mode.name}' addressed ranks {bad} outside 0..{self.world_size - 1}")
        refs = self._group._submit(self.role, spec.name, calls, spec.concurrent)
        ranks = list(refs)
        limit = self._group.timeouts.for_method(spec.name)

        def fetch(got: list[ray.ObjectRef]) -> list[Any]:
            with borrowing_store_buffers():  # no copy out of the store: collect merges, owned_outputs copies the rest
                return _in_order(self._group._gather(dict(zip(ranks, got)), label, limit), ranks)

        return DataProtoFuture(
            list(refs.values()),
            collect_fn=lambda outputs: owned_outputs(mode.collect(ctx, dict(zip(ranks, outputs)))),
            getter=fetch,
        )

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every rank; results in rank order."""
        return self.execute_all_async(method, *args, **kwargs).get()

    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> DataProtoFuture:
        return self.submit(self._ad_hoc_spec(method, ONE_TO_ALL), args, kwargs)

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on rank 0 only and return its result."""
        return self.execute_rank_zero_async(method, *args, **kwargs).get()

    def execute_rank_zero_async(self, method: str, *args: Any, **kwargs: Any) -> DataProtoFuture:
        return self.submit(self._ad_hoc_spec(method, RANK_ZERO), args, kwargs)

    def _ad_hoc_spec(self, method: str, mode: str) -> MethodSpec:
        if method.startswith("_") or not callable(getattr(self.worker_cls, method, None)):
            raise AttributeError(f"role '{self.role}' ({self.worker_cls.__name__}) has no public method '{method}'")
        return MethodSpec(method, mode)


class RayWorkerGroup:
    """Ray actors, one per bundle of ``resource_pool``, hosting one role or several colocated roles.

    ``workers``: a ``WorkerSpec`` (or a bare class) for one role, or ``{role_name: WorkerSpec}``
    to colocate roles in every process; they share its torch.distributed group. Calls that find
    a dead worker raise ``WorkerDiedError``; a raising worker method raises ``WorkerError``; a
    call that outlives its limit (``timeouts``: one for start-up, one per method, a default)
    raises ``WorkerTimeoutError``, and ``shutdown`` then kills the workers without waiting for
    them to close (they may be stuck in the call, or in a collective with it). Every process
    imports ``plugins`` (default: the plugins this process imported, ``loaded_plugins()``) before
    any role is built, so roles may be built from classes the plugins define and register.
    """

    def __init__(
        self,
        resource_pool: ResourcePool,
        workers: WorkerSpec | type | Mapping[str, WorkerSpec | type],
        name: str = "workers",
        timeouts: GroupTimeouts = GroupTimeouts(),
        dist_timeout_s: float = 600.0,
        plugins: Sequence[str] | None = None,
    ):
        specs = _role_specs(workers)
        self.name = name
        self.timeouts = timeouts
        self._timed_out = False
        self._pool = resource_pool
        self._hosts: list[Any] = []
        self._mesh_cache: dict[str, MeshTable] = {}
        self._roles = {role: RoleHandle(self, role, spec.cls) for role, spec in specs.items()}
        resource_pool.claim(name)
        try:
            self._start(specs, dist_timeout_s, list(loaded_plugins() if plugins is None else plugins))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, specs: dict[str, WorkerSpec], dist_timeout_s: float, plugins: list[str]) -> None:
        pool = self._pool
        host_cls = ray.remote(concurrency_groups={CONCURRENT_GROUP: 1})(WorkerHost)
        for rank, slot in enumerate(pool.slots):
            options = pool.actor_options(rank)
            self._hosts.append(
                host_cls.options(**options).remote(
                    rank, pool.world_size, slot.local_rank, pool.device, pool.num_threads, dist_timeout_s
                )
            )
        init = self.timeouts.init
        if plugins:
            self._gather({r: h.import_plugins.remote(plugins) for r, h in enumerate(self._hosts)}, "import_plugins", init)
        master = self._gather({0: self._hosts[0].offer_master_address.remote()}, "offer_master_address", init)[0]
        builds = {role: (spec.cls, spec.args, spec.kwargs) for role, spec in specs.items()}
        label = ", ".join(f"{role}.__init__" for role in specs)
        infos = self._gather({r: h.build.remote(*master, builds) for r, h in enumerate(self._hosts)}, label, init)
        self.workers: list[WorkerInfo] = [infos[rank] for rank in range(pool.world_size)]
        nodes = list(dict.fromkeys(info.node_id for info in self.workers))
        logger.info("group '%s': %d worker(s) on node(s) %s, roles %s", self.name, pool.world_size, nodes, list(specs))

    @property
    def world_size(self) -> int:
        return self._pool.world_size

    @property
    def roles(self) -> dict[str, RoleHandle]:
        return dict(self._roles)

    def role(self, name: str) -> RoleHandle:
        if name not in self._roles:
            raise KeyError(f"group '{self.name}' has no role '{name}'; roles: {list(self._roles)}")
        return self._roles[name]

    def __getattr__(self, name: str) -> Any:
        roles = self.__dict__.get("_roles")
        if roles is None or name.startswith("__"):
            raise AttributeError(name)
        if name in roles:
            return roles[name]
        if len(roles) == 1:
            return getattr(next(iter(roles.values())), name)
        raise AttributeError(
            f"group '{self.__dict__.get('name')}' hosts roles {list(roles)}; call methods as wg.<role>.{name}(...)"
        )

    def mesh_table(self, mesh_name: str) -> MeshTable:
        """The group's layout of ``mesh_name``, asked from the workers once and cached."""
        if mesh_name not in self._mesh_cache:
            queries = {r: h.mesh_info.remote(mesh_name) for r, h in enumerate(self._hosts)}
            members = self._gather(queries, "mesh_info", self.timeouts.default)
            self._mesh_cache[mesh_name] = MeshTable.from_members(mesh_name, [members[r] for r in range(self.world_size)])
        return self._mesh_cache[mesh_name]

    def _gather(self, refs: Mapping[int, ray.ObjectRef], method: str, limit: CallLimit) -> dict[int, Any]:
        """``gather`` for this group's calls; a timeout marks the group so ``shutdown`` kills without waiting."""
        try:
            return gather(refs, method, limit, self.name)
        except WorkerTimeoutError:
            self._timed_out = True
            raise

    def _submit(self, role: str, method: str, calls: dict[int, tuple[tuple, dict]],
                concurrent: bool = False) -> dict[int, ray.ObjectRef]:
        """Start the per-rank calls (``concurrent``: on the workers' second thread); an argument object sent to
        several ranks is put in the object store once."""
        if not self._hosts:
            raise RuntimeError(f"group '{self.name}' is shut down")
        uses = Counter(id(v) for args, kwargs in calls.values() for v in (*args, *kwargs.values()))
        shared: dict[int, ray.ObjectRef] = {}

        def ship(value: Any) -> Any:
            if uses[id(value)] < 2 or isinstance(value, _PLAIN_VALUES):
                return value
            if id(value) not in shared:
                shared[id(value)] = ray.put(value)
            return shared[id(value)]

        def caller(rank: int) -> Any:
            return self._hosts[rank].call.options(concurrency_group=CONCURRENT_GROUP) if concurrent else self._hosts[rank].call

        return {
            rank: caller(rank).remote(role, method, *[ship(a) for a in args], **{k: ship(v) for k, v in kwargs.items()})
            for rank, (args, kwargs) in calls.items()
        }

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Let the roles close (not after a timed-out call), kill the actors and release the placement groups (idempotent)."""
        hosts, self._hosts = self._hosts, []
        timeout_s = 0.0 if self._timed_out else timeout_s
        closing = [host.close.remote() for host in hosts]
        done, _ = ray.wait(closing, num_returns=len(closing), timeout=timeout_s) if closing else ([], [])
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:  # a dead or failing worker is killed below all the same
                logger.warning("group '%s': a worker failed to close: %s", self.name, str(exc).splitlines()[0])
        for host in hosts:
            ray.kill(host, no_restart=True)
        self._pool.release()

    def __enter__(self) -> "RayWorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()


def _role_specs(workers: WorkerSpec | type | Mapping[str, WorkerSpec | type]) -> dict[str, WorkerSpec]:
    if not isinstance(workers, Mapping):
        workers = {_SINGLE_ROLE: workers}
    if not workers:
        raise ValueError("a worker group needs at least one role")
    specs = {}
    for role, spec in workers.items():
        if not role.isidentifier() or hasattr(RayWorkerGroup, role):
            raise ValueError(f"role name '{role}' must be an identifier that is not a RayWorkerGroup attribute")
        specs[role] = spec if isinstance(spec, WorkerSpec) else WorkerSpec(spec)
    return specs
