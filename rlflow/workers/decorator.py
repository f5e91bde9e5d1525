"""``@register``: marks a worker method as callable from the controller, with its dispatch mode."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

from rlflow.workers.dispatch import ONE_TO_ALL
from rlflow.workers.metrics import DEFAULT_REDUCTION, ReduceSpec, check_reduce_spec

_SPEC_ATTR = "__rlflow_method_spec__"
CONCURRENT_GROUP = "concurrent"  # the Ray concurrency group (one thread) of ``concurrent`` calls
F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class MethodSpec:
    """How the controller calls one worker method: dispatch mode, mesh, blocking, metric reduction."""

    name: str
    dispatch_mode: str = ONE_TO_ALL
    mesh: str | None = None
    blocking: bool = True
    reduce: ReduceSpec = DEFAULT_REDUCTION
    concurrent: bool = False  # runs beside the call in progress (``CONCURRENT_GROUP``), not after it


def register(
    dispatch_mode: str = ONE_TO_ALL,
    mesh: str | None = None,
    blocking: bool = True,
    reduce: ReduceSpec = DEFAULT_REDUCTION,
    concurrent: bool = False,
) -> Callable[[F], F]:
    """Expose a worker method on the worker group.

    ``dispatch_mode``: a registered mode (``ONE_TO_ALL``, ``ALL_TO_ALL``, ``RANK_ZERO``,
    ``DP_COMPUTE`` or a custom one). ``mesh``: the mesh ``DP_COMPUTE`` splits over (None: every
    rank is a DP rank). ``blocking=False``: the group method returns a ``DataProtoFuture``.
    ``reduce``: how metrics dicts from the collected ranks combine (see ``rlflow.workers.metrics``).
    ``concurrent=True``: the call runs on the worker's second thread, beside a call in progress, instead of
    after it (a worker's calls otherwise run one at a time, in the order sent); for a call that must reach a
    worker busy with a long one (a weight sync that pauses a generation). Its method must be thread-safe
    against the worker's other methods.
    """
    if callable(dispatch_mode):
        raise TypeError("use @register(dispatch_mode=...) with parentheses, e.g. @register(dispatch_mode=ONE_TO_ALL)")
    check_reduce_spec(reduce)

    def decorate(fn: F) -> F:
        setattr(fn, _SPEC_ATTR, MethodSpec(fn.__name__, dispatch_mode, mesh, blocking, reduce, concurrent))
        return fn

    return decorate


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every ``@register``-ed method of ``cls`` (inherited ones included), by name."""
    specs = {}
    for name, member in inspect.getmembers(cls, callable):
        spec = getattr(member, _SPEC_ATTR, None)
        if isinstance(spec, MethodSpec):
            specs[name] = replace(spec, name=name)  # an aliased method keeps its spec under the new name
    return specs
