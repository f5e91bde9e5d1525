"""Tool-call parsers: the tool calls written in an assistant turn's decoded text.

A parser is a ``ToolCallParser`` subclass registered with ``@TOOL_CALL_PARSER_REGISTRY.register("format")``
(which sets its ``format``); ``rollout.multi_turn.format`` picks one and ``get_parser`` builds it.
``parse(text)`` never raises: every call that cannot be read becomes one readable error string in
``ParsedCalls.errors``, for the model to see as a tool response.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.tools.base import ToolCall
from rlflow.utils.registry import Registry


@dataclass(frozen=True)
class ParsedCalls:
    """The calls read from one turn, in order, and one message per call that could not be read."""

    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]


class ToolCallParser(ABC):
    """Reads the tool calls of one format out of an assistant turn."""

    format: ClassVar[str] = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedCalls:
        """The calls in ``text``; never raises."""


TOOL_CALL_PARSER_REGISTRY: Registry[type[ToolCallParser]] = Registry(
    "tool-call format", "rollout.multi_turn.format", error=ConfigError, base=ToolCallParser,
    name_attribute="format", hint="add one with @TOOL_CALL_PARSER_REGISTRY.register(name) (docs/tools.md)")


def get_parser(name: str) -> ToolCallParser:
    """The parser registered for the format ``name`` (``rollout.multi_turn.format``)."""
    return TOOL_CALL_PARSER_REGISTRY.get(name)()


@TOOL_CALL_PARSER_REGISTRY.register("hermes")
class HermesParser(ToolCallParser):
    """The Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

    A block opened again before it is closed, or never closed, is an unclosed block; a closing tag
    with no block open is ignored.
    """

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    TAGS = re.compile(r"</?tool_call>")
    EXPECTED = '{"name": "<tool>", "arguments": {...}} between <tool_call> and </tool_call>'

    def parse(self, text: str) -> ParsedCalls:
        calls: list[ToolCall] = []
        errors: list[str] = []
        start = None  # where the open block's JSON starts
        for tag in self.TAGS.finditer(text):
            if tag.group() == self.CLOSE and start is not None:
                self._read(text[start:tag.start()], len(calls) + len(errors) + 1, calls, errors)
                start = None
            elif tag.group() == self.OPEN:
                if start is not None:
                    errors.append(self._unclosed(len(calls) + len(errors) + 1))
                start = tag.end()
        if start is not None:
            errors.append(self._unclosed(len(calls) + len(errors) + 1))
        return ParsedCalls(tuple(calls), tuple(errors))

    def _read(self, block: str, number: int, calls: list[ToolCall], errors: list[str]) -> None:
        """Append the call in one block's text, or the reason it is not one."""
        try:
            payload = json.loads(block)
        except json.JSONDecodeError as error:
            errors.append(f"tool call {number}: invalid JSON ({error}); write {self.EXPECTED}")
            return
        if not isinstance(payload, dict):
            errors.append(f"tool call {number}: expected a JSON object, got {type(payload).__name__}; "
                          f"write {self.EXPECTED}")
            return
        name, arguments = payload.get("name"), payload.get("arguments", {})
        if not isinstance(name, str) or not name:
            errors.append(f"tool call {number}: missing \"name\" (the tool to call); write {self.EXPECTED}")
        elif not isinstance(arguments, dict):
            errors.append(f"tool call {number} ({name}): \"arguments\" must be a JSON object, got "
                          f"{type(arguments).__name__}; write {self.EXPECTED}")
        else:
            calls.append(ToolCall(name, arguments))

    def _unclosed(self, number: int) -> str:
        return f"tool call {number}: {self.OPEN} is never closed; end each call with {self.CLOSE}"
