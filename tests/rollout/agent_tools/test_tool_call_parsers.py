"""The hermes tool-call parser: calls in order, one readable error per unreadable block, never an exception."""

from __future__ import annotations

import pytest

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.tools.base import ToolCall
from rlflow.rollout.agent.tools.parsers import TOOL_CALL_PARSER_REGISTRY, HermesParser, ParsedCalls, get_parser


def parse(text: str) -> ParsedCalls:
    return get_parser("hermes").parse(text)


def test_one_call():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n'
            '</tool_call>')
    assert parse(text) == ParsedCalls((ToolCall("calculator", {"expression": "2 + 2"}),), ())


def test_two_calls_in_order():
    text = ('<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 3"}}</tool_call>')
    assert parse(text).calls == (ToolCall("python", {"code": "print(1)"}),
                                 ToolCall("calculator", {"expression": "3 * 3"}))
    assert parse(text).errors == ()


def test_text_without_calls():
    assert parse("The answer is 4.\n#### 4") == ParsedCalls((), ())
    assert parse("") == ParsedCalls((), ())


def test_a_call_without_arguments_has_empty_arguments():
    assert parse('<tool_call>{"name": "clock"}</tool_call>').calls == (ToolCall("clock", {}),)


@pytest.mark.parametrize("block, message", [
    ('{"name": "calculator", "arguments": {"expression": "1"}', "tool call 1: invalid JSON"),
    ("not json at all", "tool call 1: invalid JSON"),
    ('["calculator"]', "tool call 1: expected a JSON object, got list"),
    ('{"arguments": {"expression": "1"}}', 'tool call 1: missing "name"'),
    ('{"name": "", "arguments": {}}', 'tool call 1: missing "name"'),
    ('{"name": "calculator", "arguments": "1 + 1"}', 'tool call 1 (calculator): "arguments" must be a JSON object'),
    ('{"name": "calculator", "arguments": [1]}', '"arguments" must be a JSON object, got list'),
])
def test_each_malformed_block_is_one_error_that_shows_the_expected_form(block, message):
    parsed = parse(f"<tool_call>{block}</tool_call>")
    assert parsed.calls == () and len(parsed.errors) == 1
    assert message in parsed.errors[0] and "between <tool_call> and </tool_call>" in parsed.errors[0]


def test_an_unclosed_block_is_an_error_and_the_good_calls_still_run():
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>\n'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}')
    parsed = parse(text)
    assert parsed.calls == (ToolCall("calculator", {"expression": "1"}),)
    assert parsed.errors == ("tool call 2: <tool_call> is never closed; end each call with </tool_call>",)


def test_a_block_opened_again_before_it_closed_is_unclosed():
    text = '<tool_call>{"name": "a"<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    parsed = parse(text)
    assert parsed.calls == (ToolCall("b", {}),)
    assert len(parsed.errors) == 1 and "never closed" in parsed.errors[0]


def test_a_stray_closing_tag_is_ignored():
    assert parse("done </tool_call> really") == ParsedCalls((), ())


def test_the_registry_names_the_config_key():
    assert get_parser("hermes").__class__ is HermesParser and HermesParser.format == "hermes"
    with pytest.raises(ConfigError, match=r"unknown tool-call format 'mistral' \(config key rollout.multi_turn.format\)"
                       r"; registered: hermes"):
        TOOL_CALL_PARSER_REGISTRY.get("mistral")
