"""``Env``: a multi-turn environment in SkyRL-gym's shape, and the registry of environments.

``init(prompt)`` sees the row and returns the first observation to append (may be empty: the prompt
already asks); ``step(action)`` takes the model's decoded turn and returns ``EnvStep``: the next
observation (messages for the chat template), a reward and whether the episode is done. The
``env_agent`` loop drives one fresh instance per trajectory. Register an environment with
``@ENV_REGISTRY.register("name")`` (in a ``trainer.plugins`` file for the rollout workers to see it);
a row picks it with ``extra_info.env_class``, else ``rollout.multi_turn.env_class`` does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from rlflow.config.validation import ConfigError
from rlflow.utils.registry import Registry


@dataclass(frozen=True)
class EnvStep:
    """What one ``step`` returns: the observation messages to append, the step's reward, and whether it ended."""

    observation: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode of a task; a fresh instance per trajectory. ``row`` is the data row (``extra_info``,
    ``ground_truth``, ``raw_prompt`` ...)."""

    name: str = ""

    def __init__(self, row: dict[str, Any]):
        self.row = row

    def init(self, prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages to append before the first model turn; none by default."""
        return []

    @abstractmethod
    def step(self, action: str) -> EnvStep:
        """React to the model's turn (decoded text, special tokens skipped)."""


ENV_REGISTRY: Registry[type[Env]] = Registry(
    "environment", "extra_info.env_class / rollout.multi_turn.env_class", error=ConfigError, base=Env,
    name_attribute="name",
)
