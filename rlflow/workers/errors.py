"""The errors a controller sees from its worker groups, each naming what failed and where."""

from __future__ import annotations

from typing import Optional

from rlflow.errors import UserError


class WorkerError(RuntimeError):
    """A worker method raised: carries the rank, the role/method and the remote traceback.

    Raised inside the worker (so the traceback is the worker's own) and re-raised as is at
    the controller.
    """

    def __init__(
        self,
        rank: int,
        method: str,
        error_type: str,
        message: str,
        remote_traceback: str,
        pid: int | None = None,
        node_id: str | None = None,
    ):
        self.rank = rank
        self.method = method
        self.error_type = error_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.pid = pid
        self.node_id = node_id
        where = f"rank {rank}" + (f", pid {pid}" if pid is not None else "")
        where += f", node {node_id[:8]}" if node_id else ""
        super().__init__(
            f"{method} failed on worker {where}: {error_type}: {message}\n"
            f"--- remote traceback (rank {rank}) ---\n{remote_traceback.rstrip()}"
        )

    def __reduce__(self):  # keyword-rich __init__: pickle every field, not just the message
        return (
            type(self),
            (self.rank, self.method, self.error_type, self.message, self.remote_traceback, self.pid, self.node_id),
        )


class WorkerUserError(WorkerError, UserError):
    """A worker method rejected the user's input (it raised a ``UserError``, e.g. a malformed file).

    Entry points report it like a controller-side ``UserError``: one line saying what to fix,
    with the worker's traceback kept in ``remote_traceback`` for debugging.
    """

    def __str__(self) -> str:
        return f"{self.message} (raised by {self.method} on worker rank {self.rank})"


def worker_error_from(exc: BaseException, rank: int, method: str, remote_traceback: str,
                      pid: int | None = None, node_id: str | None = None) -> WorkerError:
    """The ``WorkerError`` that reports ``exc``: a ``WorkerUserError`` when it is the user's input at fault."""
    error_class = WorkerUserError if isinstance(exc, UserError) else WorkerError
    return error_class(rank, method, type(exc).__name__, str(exc), remote_traceback, pid, node_id)


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, crashed, out of memory) while the controller waited on it; ``group``: the
    name of its worker group, where known."""

    def __init__(self, rank: int, method: str, reason: str, group: Optional[str] = None):
        self.rank = rank
        self.method = method
        self.reason = reason
        self.group = group
        where = f" of worker group '{group}'" if group else ""
        super().__init__(f"worker rank {rank}{where} died while running {method}: {reason}")

    def __reduce__(self):  # keyword-rich __init__: pickle every field, not just the message
        return type(self), (self.rank, self.method, self.reason, self.group)


class WorkerTimeoutError(UserError, TimeoutError):
    """Workers did not answer a call within its ``CallLimit``: names the phase, the call and the ranks still running.

    A ``UserError``: the entry points print it as one line and exit with status 2, since what
    to do is either to raise the limit (the message names its config key) or to fix the hang.
    """

    def __init__(self, method: str, pending_ranks: list[int], timeout_s: float, phase: Optional[str] = None,
                 config_key: Optional[str] = None, group: Optional[str] = None):
        self.method = method
        self.pending_ranks = pending_ranks
        self.timeout_s = timeout_s
        self.phase = phase
        self.group = group
        where = f" of worker group '{group}'" if group else ""
        fix = f"raise {config_key}" if config_key else "raise the call's timeout"
        super().__init__(
            (f"{phase} phase timed out: " if phase else "")
            + f"{method} did not finish within {timeout_s:.1f} s on ranks {pending_ranks}{where} (still running there); "
            f"{fix} if the work is legitimately this slow, else look for a hung worker"
        )


class ResourceUnavailableError(UserError, RuntimeError):
    """A resource pool cannot be placed on the cluster; the message names what is missing."""
