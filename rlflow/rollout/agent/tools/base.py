"""The tool interface, the tool registry and the one function that runs a model's tool call.

A tool is a ``Tool`` subclass registered with ``@TOOL_REGISTRY.register("name")`` (which sets its
``name``); a config turns tools on by listing them in ``rollout.multi_turn.tools`` and passes each its
options under ``rollout.multi_turn.tool_options.<name>``. ``build_tools`` makes the instances,
``run_tool_call`` runs one parsed call. Whatever the model writes, running a call gives a
``ToolResult``: bad arguments, an unknown tool and a tool's own bug all come back as error results the
model reads, never as an exception that ends the rollout. See docs/tools.md.
"""

from __future__ import annotations

import logging
from collections import Counter
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from rlflow.config.validation import ConfigError
from rlflow.utils.registry import Registry

logger = logging.getLogger(__name__)

TOOLS_KEY = "rollout.multi_turn.tools"
TOOL_OPTIONS_KEY = "rollout.multi_turn.tool_options"


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What the model reads as the tool's response; ``error`` marks ``text`` as an error message."""

    text: str
    error: bool = False


class Tool(ABC):
    """A function the model can call: its OpenAI schema, its options, and ``call``.

    Subclasses set ``description``, ``parameters`` (the JSON schema of the arguments) and ``defaults``
    (every option the tool takes, with its default value; an option's type is its default's type).
    ``call`` must not raise for bad model input: it returns ``ToolResult(message, error=True)``.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, options: Mapping[str, Any]) -> None:
        for key, value in options.items():
            if key not in self.defaults:
                takes = ", ".join(sorted(self.defaults)) or "no options"
                raise ConfigError(f"unknown option {self.option_key(key)}; the {self.name} tool takes: {takes}")
            _check_type(self.option_key(key), value, self.defaults[key])
        self.options: dict[str, Any] = {**self.defaults, **options}

    def option_key(self, key: str) -> str:
        """The full config key of one of this tool's options."""
        return f"{TOOL_OPTIONS_KEY}.{self.name}.{key}"

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema the chat template shows the model."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @abstractmethod
    async def call(self, arguments: dict[str, Any], row_kwargs: dict[str, Any]) -> ToolResult:
        """Run the tool on the model's ``arguments``; ``row_kwargs`` are the data row's arguments for this
        tool (verl's ``extra_info.tools_kwargs[<name>]``, empty when the row has none)."""


_ACCEPTED_TYPES = {float: (int, float)}  # an option's default type -> the value types it takes


def _check_type(key: str, value: Any, default: Any) -> None:
    """An option value must have its default's type (an int passes for a float, a bool for nothing else)."""
    accepted = _ACCEPTED_TYPES.get(type(default), (type(default),))
    if type(value) not in accepted:
        raise ConfigError(f"{key} must be of type {type(default).__name__}; got {value!r}")


TOOL_REGISTRY: Registry[type[Tool]] = Registry(
    "tool", TOOLS_KEY, error=ConfigError, base=Tool, name_attribute="name",
    hint="add one with @TOOL_REGISTRY.register(name) on a Tool subclass (docs/tools.md)")


def build_tools(names: Sequence[str], options: Mapping[str, Mapping[str, Any]]) -> dict[str, Tool]:
    """One instance of each tool in ``names`` (``rollout.multi_turn.tools``), built with its options
    from ``options`` (``rollout.multi_turn.tool_options``), keyed by name."""
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ConfigError(f"{TOOLS_KEY} lists {', '.join(repeated)} more than once; list each tool once")
    stray = sorted(set(options) - set(names))
    if stray:
        raise ConfigError(f"{TOOL_OPTIONS_KEY} has options for {', '.join(stray)}, which {TOOLS_KEY} does not "
                          f"list; add the tool to {TOOLS_KEY} or drop its options")
    return {name: TOOL_REGISTRY.get(name)(dict(options.get(name) or {})) for name in names}


async def run_tool_call(tools: Mapping[str, Tool], call: ToolCall, row_kwargs: dict[str, Any]) -> ToolResult:
    """Run ``call`` with the tool it names; ``row_kwargs`` are the row's arguments for that tool
    (``extra_info.tools_kwargs[call.name]``, ``{}`` when absent).

    An unknown tool gives an error result listing the available ones, and an exception raised by a
    tool gives ``"<ExceptionType>: <message>"`` as an error result (logged with its traceback).
    """
    tool = tools.get(call.name)
    if tool is None:
        available = ", ".join(sorted(tools)) or "none"
        return ToolResult(f"unknown tool {call.name!r}; the available tools are: {available}", error=True)
    try:
        return await tool.call(call.arguments, row_kwargs)
    except Exception as error:  # a tool's bug is the model's error result, never the end of the rollout
        logger.exception("tool %r raised on arguments %r", call.name, call.arguments)
        return ToolResult(f"{type(error).__name__}: {error}", error=True)
