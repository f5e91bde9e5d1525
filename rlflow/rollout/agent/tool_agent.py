"""``tool_agent``: the model calls tools over several turns until it answers without a call.

Each model turn is parsed with ``rollout.multi_turn.format`` (``hermes``: ``<tool_call>{json}</tool_call>``
blocks). The calls (at most ``max_parallel_calls`` a turn; the rest are answered with an error) run
concurrently with the row's ``extra_info.tools_kwargs[<tool>]``; their results, and a malformed call's
error, go back as ``tool`` messages, each cut to ``max_tool_response_length`` characters on
``tool_response_truncate_side``. The loop ends on a turn without calls, at ``max_assistant_turns``
model turns or ``max_user_turns`` tool turns, or when the response budget is spent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY, AgentContext, AgentInput, AgentLoop
from rlflow.rollout.agent.tools import ToolResult, build_tools, get_parser, run_tool_call
from rlflow.rollout.agent.trajectory import Trajectory

TRUNCATION_MARK = "...(truncated)..."
_BUILT: dict[str, dict[str, Any]] = {}  # the tools of one (tools, options) config, built once per process


def process_tools(names: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """``build_tools(names, options)``, built on the first call in this process and reused by every generation
    call after it (the python tool probes the machine's isolation when it is built)."""
    key = json.dumps([names, options], sort_keys=True, default=str)
    if key not in _BUILT:
        _BUILT[key] = build_tools(names, options)
    return _BUILT[key]


def truncate_text(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters on ``side`` (left | middle | right), with a marker where it was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(TRUNCATION_MARK))
    if side == "left":
        return TRUNCATION_MARK + text[len(text) - keep:]
    if side == "right":
        return text[:keep] + TRUNCATION_MARK
    head = keep // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - (keep - head):]


@AGENT_LOOP_REGISTRY.register("tool_agent")
class ToolAgentLoop(AgentLoop):
    """Model turns and tool turns, token ids passed straight through."""

    def __init__(self, ctx: AgentContext):
        super().__init__(ctx)
        config = ctx.multi_turn
        self.tools = process_tools(list(config.tools), dict(config.tool_options or {}))
        self.parser = get_parser(config.format)

    async def run(self, sample: AgentInput) -> Trajectory:
        ctx, config = self.ctx, self.ctx.multi_turn
        tools_kwargs = (sample.row.get("extra_info") or {}).get("tools_kwargs") or {}
        trajectory = Trajectory(list(sample.prompt_ids), ctx.sampling.max_new_tokens)
        while trajectory.room > 0:
            tokens, completion = await ctx.generate(trajectory, sample)
            trajectory.add_model_turn(tokens, completion)
            if completion.finish_reason != "stop" or trajectory.turns == config.max_assistant_turns:
                break
            parsed = self.parser.parse(ctx.tokenizer.decode(tokens, skip_special_tokens=True))
            if not parsed.calls and not parsed.errors:
                break
            if trajectory.env_turns == config.max_user_turns:
                break
            results = await self._call(parsed.calls, tools_kwargs)
            results += [ToolResult(error, error=True) for error in parsed.errors]
            trajectory.tool_calls += len(parsed.calls) + len(parsed.errors)
            trajectory.tool_errors += sum(result.error for result in results)
            messages = [{"role": "tool", "content": truncate_text(result.text, config.max_tool_response_length,
                                                                  config.tool_response_truncate_side)}
                        for result in results]
            if not trajectory.add_env_turn(ctx.turns.encode(messages)):
                break
        return trajectory

    async def _call(self, calls, tools_kwargs) -> list[ToolResult]:
        limit = self.ctx.multi_turn.max_parallel_calls
        results = list(await asyncio.gather(*(
            run_tool_call(self.tools, call, tools_kwargs.get(call.name) or {}) for call in calls[:limit]
        )))
        results += [ToolResult(f"too many tool calls in one turn: at most {limit} run (max_parallel_calls)", error=True)
                    for _ in calls[limit:]]
        return results
