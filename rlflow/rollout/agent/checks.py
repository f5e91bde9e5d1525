"""Pre-Ray checks of ``rollout.multi_turn`` and of the data rows' ``agent_name``, and the tool schemas the
prompts are rendered with."""

from __future__ import annotations

from typing import Any, Iterable

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY
from rlflow.rollout.agent.tools import build_tools


def tool_schemas(multi_turn: Any) -> list[dict[str, Any]]:
    """The OpenAI function schemas of the configured tools (built with their options, so a bad option or a
    machine that cannot isolate the python tool fails here); none unless ``multi_turn.enable``."""
    if not multi_turn.enable or not multi_turn.tools:
        return []
    tools = build_tools(list(multi_turn.tools), dict(multi_turn.tool_options or {}))
    return [tool.schema() for tool in tools.values()]


def check_agent_names(names: Iterable[str], multi_turn: Any, where: str) -> None:
    """Every ``agent_name`` of the rows in ``where`` names a registered loop, and naming one needs
    ``rollout.multi_turn.enable``."""
    named = sorted({name for name in names if name})
    if not named:
        return
    if not multi_turn.enable:
        raise ConfigError(f"{where}: rows name agent loops ({', '.join(named)}) in their agent_name column; "
                          "set rollout.multi_turn.enable=true to run them")
    for name in named:
        if name not in AGENT_LOOP_REGISTRY:
            raise ConfigError(f"{where}: {AGENT_LOOP_REGISTRY.unknown_message(name, 'agent_name')}")
