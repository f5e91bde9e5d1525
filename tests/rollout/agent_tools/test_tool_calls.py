"""Building tools from the config and running one call: every failure is a ConfigError or an error result."""

from __future__ import annotations

import asyncio

import pytest

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.tools.base import TOOL_REGISTRY, Tool, ToolCall, ToolResult, build_tools, run_tool_call


class Echo(Tool):
    name = "echo"
    description = "Echo the text and the row's tag."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    defaults = {"prefix": "", "times": 1, "scale": 1.0, "loud": False}

    async def call(self, arguments, row_kwargs):
        text = arguments["text"] * self.options["times"]
        return ToolResult(f"{self.options['prefix']}{text}{row_kwargs.get('tag', '')}")


class Broken(Tool):
    name = "broken"
    description = "Always raises."
    parameters = {"type": "object", "properties": {}}

    async def call(self, arguments, row_kwargs):
        raise RuntimeError("boom")


def run(tools, call, row_kwargs=None) -> ToolResult:
    return asyncio.run(run_tool_call(tools, call, row_kwargs or {}))


def test_a_call_runs_with_its_arguments_options_and_row_kwargs():
    tools = {"echo": Echo({"prefix": "> ", "times": 2})}
    assert run(tools, ToolCall("echo", {"text": "hi"}), {"tag": "!"}) == ToolResult("> hihi!")


def test_an_unknown_tool_is_an_error_result_listing_the_available_tools():
    tools = {"echo": Echo({}), "broken": Broken({})}
    result = run(tools, ToolCall("search", {"query": "x"}))
    assert result == ToolResult("unknown tool 'search'; the available tools are: broken, echo", error=True)
    assert run({}, ToolCall("search", {})).text.endswith("the available tools are: none")


def test_a_tool_that_raises_is_an_error_result_not_a_crash(caplog):
    assert run({"broken": Broken({})}, ToolCall("broken", {})) == ToolResult("RuntimeError: boom", error=True)
    assert "tool 'broken' raised" in caplog.text and "Traceback" in caplog.text
    # a KeyError from the model's missing argument is the tool's bug, reported the same way
    assert run({"echo": Echo({})}, ToolCall("echo", {})) == ToolResult("KeyError: 'text'", error=True)


def test_schema_is_the_openai_function_schema():
    assert Echo({}).schema() == {"type": "function", "function": {
        "name": "echo", "description": Echo.description, "parameters": Echo.parameters}}


def test_options_are_checked_against_the_defaults():
    with pytest.raises(ConfigError, match=r"unknown option rollout.multi_turn.tool_options.echo.prefx; "
                                          r"the echo tool takes: loud, prefix, scale, times"):
        Echo({"prefx": "> "})
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool_options.echo.times must be of type int; got '2'"):
        Echo({"times": "2"})
    with pytest.raises(ConfigError, match=r"echo.loud must be of type bool; got 1"):
        Echo({"loud": 1})
    with pytest.raises(ConfigError, match=r"echo.times must be of type int; got True"):
        Echo({"times": True})
    assert Echo({"scale": 2}).options["scale"] == 2  # an int passes for a float


def test_build_tools_makes_each_listed_tool_with_its_options():
    tools = build_tools(["calculator"], {"calculator": {}})
    assert list(tools) == ["calculator"] and tools["calculator"].name == "calculator"
    assert set(TOOL_REGISTRY.names()) >= {"calculator", "python"}


@pytest.mark.parametrize("names, options, message", [
    (["calculater"], {}, r"unknown tool 'calculater' \(config key rollout.multi_turn.tools\); registered: "),
    (["calculator", "calculator"], {}, r"rollout.multi_turn.tools lists calculator more than once"),
    (["calculator"], {"python": {"timeout_s": 1}},
     r"rollout.multi_turn.tool_options has options for python, which rollout.multi_turn.tools does not list"),
    (["calculator"], {"calculator": {"precision": 3}},
     r"unknown option rollout.multi_turn.tool_options.calculator.precision; the calculator tool takes: no options"),
])
def test_build_tools_config_errors_name_the_key(names, options, message):
    with pytest.raises(ConfigError, match=message):
        build_tools(names, options)
