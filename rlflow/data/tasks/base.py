"""The synthetic-task interface and its registry.

A task is a small dataclass whose fields are its options (e.g. ``digits``); ``sample(rng)``
draws one problem. Tasks are registered by name with ``@TASK_REGISTRY.register("name")`` (which sets the
class's ``name``) and built
with ``build_task(name, **options)``. Each task's rows carry ``data_source = "synthetic/<name>"``,
which is how the reward registry finds the task's ``score`` function.
"""

from __future__ import annotations

import dataclasses
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from rlflow.data.tasks.answer import score_final_answer
from rlflow.utils.registry import Registry

DATA_SOURCE_PREFIX = "synthetic/"


@dataclass(frozen=True)
class TaskExample:
    """One generated problem: the user prompt, the ground-truth answer and a worked solution for SFT.

    ``turns`` (optional) is the SFT conversation after the prompt when it has more than one assistant
    turn (a tool call, the tool's answer, the final answer); empty: one assistant turn, ``solution``.
    """

    prompt: str
    ground_truth: str
    solution: str
    turns: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class SyntheticTask(ABC):
    """A deterministic generator of verifiable problems; subclasses add their options as fields."""

    name: ClassVar[str] = ""
    ability: ClassVar[str] = "arithmetic"
    agent_name: ClassVar[str] = ""  # the agent loop the task's RL rows name ("": the rollout's default)

    @property
    def data_source(self) -> str:
        """The ``data_source`` column value of this task's rows, e.g. ``synthetic/addition``."""
        return DATA_SOURCE_PREFIX + self.name

    def options(self) -> dict[str, Any]:
        """This task's option values (its dataclass fields)."""
        return dataclasses.asdict(self)

    @abstractmethod
    def sample(self, rng: random.Random) -> TaskExample:
        """Draw one problem using only ``rng`` (so a seed fixes the whole stream)."""

    def score(self, solution_str: object, ground_truth: object) -> float:
        """1.0 if the final answer after ``####`` is correct, else 0.0."""
        return score_final_answer(solution_str, ground_truth)


TASK_REGISTRY: Registry[type[SyntheticTask]] = Registry("synthetic task", base=SyntheticTask, name_attribute="name")


def get_task_cls(name: str) -> type[SyntheticTask]:
    """The task class for a task name or its data_source (``addition`` or ``synthetic/addition``)."""
    return TASK_REGISTRY.get(name.removeprefix(DATA_SOURCE_PREFIX))


def task_option_names(cls: type[SyntheticTask]) -> list[str]:
    """The option names a task class accepts."""
    return [f.name for f in dataclasses.fields(cls)]


def build_task(name: str, **options: Any) -> SyntheticTask:
    """An instance of task ``name`` with the given options; unknown options raise a clear error."""
    cls = get_task_cls(name)
    unknown = sorted(set(options) - set(task_option_names(cls)))
    if unknown:
        raise ValueError(f"synthetic task {cls.name!r} has no option(s) {unknown}; its options are {task_option_names(cls)}")
    return cls(**options)


def score(task_name: str, solution_str: object, ground_truth: object) -> float:
    """Score a model's solution for task ``task_name`` (name or data_source): 1.0 correct, else 0.0."""
    return get_task_cls(task_name)().score(solution_str, ground_truth)
