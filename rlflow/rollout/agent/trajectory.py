"""A trajectory as it grows, token by token: model turns exactly as sampled, tool and environment turns as
tokenized once, and nothing ever re-tokenized.

``Trajectory.response_mask`` is 1 on every sampled token and 0 on every tool or environment token;
``log_probs`` holds the rollout's log-prob of each sampled token and 0.0 on the others, and ``versions`` the
policy version that sampled each token (-1 on the others, and where the server did not say), so both line
up with the response. The response never outgrows ``budget`` (``rollout.response_length``): a turn
that would is cut, and ``truncated`` records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlflow.rollout.requests import Completion


@dataclass
class Trajectory:
    """One sample's prompt, its growing response and what happened on the way."""

    prompt_ids: list[int]
    budget: int  # most response tokens (rollout.response_length)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: int = 0  # model turns
    env_turns: int = 0  # tool or environment turns appended
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False  # out of response budget (or a turn cut by its length limit)
    reward: Optional[float] = None  # set by loops whose environment scores the trajectory
    extra: dict[str, Any] = field(default_factory=dict)  # a loop's own per-trajectory values

    @property
    def ids(self) -> list[int]:
        """Prompt and response so far: the next model turn's prompt."""
        return self.prompt_ids + self.response_ids

    @property
    def room(self) -> int:
        """Response tokens still allowed."""
        return self.budget - len(self.response_ids)

    def add_model_turn(self, token_ids: list[int], completion: Completion) -> None:
        """Append the sampled ``token_ids`` (a completion's tokens, cut at its end) with their log-probs."""
        self.turns += 1
        log_probs = list(completion.log_probs[: len(token_ids)]) if completion.log_probs else None
        versions = list(completion.versions[: len(token_ids)]) if completion.versions else None
        self._append(token_ids, 1, log_probs, versions)
        if completion.finish_reason == "length":
            self.truncated = True

    def add_env_turn(self, token_ids: list[int]) -> bool:
        """Append a tool or environment turn (masked out of the loss); False, and ``truncated``, if it does not fit."""
        if len(token_ids) > self.room:
            self.truncated = True
            return False
        self.env_turns += 1
        self._append(token_ids, 0, None)
        return True

    def _append(self, token_ids: list[int], mask: int, log_probs: Optional[list[float]],
                versions: Optional[list[int]] = None) -> None:
        keep = token_ids[: self.room]
        if len(keep) < len(token_ids):
            self.truncated = True
        self.response_ids += keep
        self.response_mask += [mask] * len(keep)
        self.log_probs += (log_probs or [0.0] * len(keep))[: len(keep)]
        self.versions += (versions or [-1] * len(keep))[: len(keep)]

    def metrics(self) -> dict[str, float]:
        """Per-trajectory values the worker averages into the step's metrics."""
        return {
            "num_turns": float(self.turns + self.env_turns),
            "agent/model_turns": float(self.turns),
            "agent/tool_calls": float(self.tool_calls),
            "agent/tool_errors": float(self.tool_errors),
            "agent/truncated": float(self.truncated),
        }
