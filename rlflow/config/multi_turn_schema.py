"""``rollout.multi_turn``: agent loops, tools and environments (verl's ``rollout.multi_turn`` keys where it has them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from rlflow.config.ranges import AT_LEAST_1, NON_NEGATIVE, Ranges

TRUNCATE_SIDES = ("left", "middle", "right")


@dataclass
class MultiTurnConfig:
    """How a rollout runs each row's agent loop (docs/agents.md)."""

    enable: bool = False  # true: generation runs each row's agent loop (agent_name column, else default_agent_loop)
    default_agent_loop: str = "single_turn"  # rows without an agent_name: single_turn | tool_agent | env_agent
    max_assistant_turns: Optional[int] = None  # null: bounded by the response budget only
    max_user_turns: Optional[int] = None  # most tool / environment turns; null: bounded by the response budget only
    max_parallel_calls: int = 1  # tool calls run per model turn; extra calls get an error response
    max_tool_response_length: int = 256  # characters of one tool response the model sees
    tool_response_truncate_side: str = "middle"  # left | middle | right
    format: str = "hermes"  # tool-call format of the model's turns
    tools: list[str] = field(default_factory=list)  # registered tools the tool_agent loop offers, e.g. [calculator]
    tool_options: dict[str, Any] = field(default_factory=dict)  # per tool: {python: {timeout_s: 5}}
    env_class: Optional[str] = None  # the env_agent loop's environment for rows without extra_info.env_class

    RANGES: ClassVar[Ranges] = {
        "max_assistant_turns": AT_LEAST_1, "max_user_turns": NON_NEGATIVE, "max_parallel_calls": AT_LEAST_1,
        "max_tool_response_length": AT_LEAST_1,
    }
