"""Worker classes the worker-group tests host (shipped to Ray workers by value, see conftest)."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist

from rlflow.errors import DataError
from rlflow.protocol import DataProto
from rlflow.workers import ALL_TO_ALL, DISPATCH_MODE_REGISTRY, DP_COMPUTE, ONE_TO_ALL, RANK_ZERO, DispatchMode, Worker, register


class ProbeWorker(Worker):
    """Reports where it runs, runs collectives, and records what each dispatch handed it."""

    def __init__(self, tp_size: int = 1, tag: str = ""):
        super().__init__()
        self.tag = tag
        self.received: list[list[int]] = []
        if tp_size > 1:  # a dp x tp layout: consecutive ranks form one TP group, its first rank answers
            self.register_mesh("actor", self.rank // tp_size, self.world_size // tp_size, self.rank % tp_size == 0)

    @register(dispatch_mode=ONE_TO_ALL)
    def describe(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "backend": dist.get_backend(),
            "dist_world": dist.get_world_size(),
            "tag": self.tag,
        }

    @register(dispatch_mode=ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    @register(dispatch_mode=ALL_TO_ALL)
    def scale(self, value: float, offset: float = 0.0) -> float:
        return value * (self.rank + 1) + offset

    @register(dispatch_mode=RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @register(dispatch_mode=DP_COMPUTE, mesh="actor")
    def mark(self, data: DataProto) -> DataProto:
        """Records the row ids it got; returns them doubled with the dp rank that computed them."""
        self.received.append(data.batch["ids"].tolist())
        dp_rank = self.get_mesh("actor").dp_rank
        return DataProto.from_dict(
            {"doubled": data.batch["ids"] * 2, "dp_rank": torch.full((len(data),), dp_rank)},
            {"label": data.non_tensor_batch["label"]},
        )

    @register(dispatch_mode=DP_COMPUTE, mesh="actor", reduce={"tokens": "sum", "peak": "max"})
    def step_metrics(self, data: DataProto) -> DataProto:
        """An update-like method: per-row output plus a metrics dict in meta_info."""
        ids = data.batch["ids"].float()
        metrics = {"loss": ids.mean().item(), "tokens": len(data), "peak": ids.max().item()}
        return DataProto.from_dict({"out": ids + 0.5}, meta_info={"metrics": metrics})

    @register(dispatch_mode=DP_COMPUTE, reduce={"tokens": "sum", "peak": "max"})
    def plain_metrics(self, data: DataProto) -> dict:
        ids = data.batch["ids"].float()
        return {"loss": ids.mean().item(), "tokens": len(data), "peak": ids.max().item()}

    @register(dispatch_mode=DP_COMPUTE)
    def sample_twice(self, data: DataProto) -> DataProto:
        """Two output rows per input row, interleaved (like n=2 samples per prompt)."""
        return DataProto.from_dict({"ids": data.batch["ids"].repeat_interleave(2)})

    @register(dispatch_mode="round_robin")
    def total(self, items: list[int]) -> list[int]:
        return [item * 10 for item in items]

    @register(dispatch_mode=ONE_TO_ALL, blocking=False)
    def slow_rank(self) -> int:
        return self.rank

    def echo(self, data: DataProto) -> DataProto:
        return data

    def received_ids(self) -> list[list[int]]:
        return self.received

    def fail_on(self, rank: int, message: str, user_error: bool = False) -> int:
        """The given rank raises: a ``DataError`` (the user's input at fault) or a ``ValueError`` (a bug)."""
        if self.rank == rank:
            raise (DataError if user_error else ValueError)(message)
        return self.rank

    def die_on(self, rank: int, others_sleep_s: float = 0.0) -> int:
        """The given rank's process exits mid-call; the others stay busy for ``others_sleep_s``."""
        if self.rank == rank:
            os._exit(1)
        time.sleep(others_sleep_s)
        return self.rank

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def pid(self) -> int:
        return os.getpid()


class TrainRole(Worker):
    """A colocated role: sums ranks over the shared process group."""

    @register(dispatch_mode=ONE_TO_ALL)
    def pid_and_sum(self) -> tuple[int, float]:
        value = torch.tensor([float(self.rank)])
        dist.all_reduce(value)
        return os.getpid(), value.item()


class GenerateRole(Worker):
    """A second colocated role with its own mesh and method names."""

    def __init__(self, dp_size: int):
        super().__init__()
        self.register_mesh("rollout", self.rank % dp_size, dp_size, self.rank < dp_size)

    @register(dispatch_mode=ONE_TO_ALL)
    def pid_and_sum(self) -> tuple[int, float]:
        value = torch.tensor([10.0 * self.rank])
        dist.all_reduce(value)
        return os.getpid(), value.item()

    @register(dispatch_mode=DP_COMPUTE, mesh="rollout")
    def generate(self, prompts: DataProto) -> DataProto:
        return DataProto.from_dict({"response": prompts.batch["ids"] + 100})


# override: Ray workers import this file under another module name than the test process does
@DISPATCH_MODE_REGISTRY.register("round_robin", override=True)
class RoundRobin(DispatchMode):
    """Custom mode: rank r gets items r, r + world, r + 2*world ... of the one list argument."""

    @staticmethod
    def dispatch(ctx, args, kwargs):
        (items,) = args
        return {rank: ((items[rank :: ctx.world_size],), {}) for rank in range(ctx.world_size)}

    @staticmethod
    def collect(ctx, outputs):
        merged = [None] * sum(len(out) for out in outputs.values())
        for rank, out in outputs.items():
            merged[rank :: ctx.world_size] = out
        return merged


class SlowInitWorker(Worker):
    """Takes ``seconds`` to build: a worker start-up that outlives its limit."""

    def __init__(self, seconds: float):
        super().__init__()
        time.sleep(seconds)


class GateWorker(Worker):
    """A long call that waits for a gate, and a ``concurrent`` call that opens it: the second can only return
    while the first is in progress if it runs beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.order: list[str] = []

    @register(dispatch_mode=ONE_TO_ALL)
    def wait_for_gate(self, timeout_s: float) -> bool:
        self.order.append("wait_for_gate")
        return self.gate.wait(timeout_s)

    @register(dispatch_mode=ONE_TO_ALL, concurrent=True)
    def open_gate(self) -> str:
        self.gate.set()
        return threading.current_thread().name

    @register(dispatch_mode=ONE_TO_ALL)
    def record(self, name: str) -> list[str]:
        self.order.append(name)
        return list(self.order)
