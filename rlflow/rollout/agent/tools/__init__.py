"""Tools a model calls during a multi-turn rollout, and the parsers that read its calls.

``base``: the ``Tool`` interface, ``TOOL_REGISTRY``, ``build_tools`` and ``run_tool_call``;
``parsers``: ``TOOL_CALL_PARSER_REGISTRY`` (``hermes``); ``calculator`` and ``python_tool``: the built-in
tools (the python tool's sandbox is ``sandbox.py``). Importing this package registers them all. See
docs/tools.md.
"""

from rlflow.rollout.agent.tools import calculator, python_tool  # noqa: F401  (register the built-in tools)
from rlflow.rollout.agent.tools.base import TOOL_REGISTRY, Tool, ToolCall, ToolResult, build_tools, run_tool_call
from rlflow.rollout.agent.tools.parsers import TOOL_CALL_PARSER_REGISTRY, ParsedCalls, ToolCallParser, get_parser

__all__ = [
    "TOOL_CALL_PARSER_REGISTRY",
    "TOOL_REGISTRY",
    "ParsedCalls",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "build_tools",
    "get_parser",
    "run_tool_call",
]
