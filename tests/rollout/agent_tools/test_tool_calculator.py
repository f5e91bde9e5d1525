"""The calculator tool: Python's arithmetic by an ``ast`` walk, and an error result for everything else."""

from __future__ import annotations

import asyncio

import pytest

from rlflow.rollout.agent.tools.base import ToolResult, build_tools


def calculate(expression) -> ToolResult:
    calculator = build_tools(["calculator"], {})["calculator"]
    return asyncio.run(calculator.call({"expression": expression}, {}))


@pytest.mark.parametrize("expression, expected", [
    ("2 + 3 * 4", "14"),
    ("(2 + 3) * 4", "20"),
    ("2 ** 3 ** 2", "512"),
    ("-2 ** 2", "-4"),
    ("10 - 4 - 3", "3"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("7 % 3", "1"),
    ("10 / 4", "2.5"),
    ("6 / 3", "2"),
    ("1 / 3", "0.3333333333"),
    ("2 / 3 * 1000000", "666666.6667"),
    ("0.1 + 0.2", "0.3"),
    ("2 ** -1", "0.5"),
    ("+5 - -5", "10"),
    (" 123456 ", "123456"),
    ("1e3", "1000"),
    ("2 ** 64", "18446744073709551616"),
    ("-0.0", "0"),
])
def test_results_follow_python_precedence_and_print_compactly(expression, expected):
    assert calculate(expression) == ToolResult(expected)


@pytest.mark.parametrize("expression, reason", [
    ("x + 1", "`x` is not allowed"),
    ("abs(-1)", "`abs(-1)` is not allowed"),
    ("(1).real", "`1 .real` is not allowed"),
    ("[1, 2]", "is not allowed"),
    ("1 if 1 else 2", "is not allowed"),
    ("'a' * 3", "`'a'` is not a number"),
    ("True + 1", "`True` is not a number"),
    ("1j * 2", "`1j` is not a number"),
    ("2 ^ 3", "uses an operator that is not allowed"),
    ("~1", "uses an operator that is not allowed"),
    ("1 < 2", "is not allowed"),
    ("2 ** 65", "the exponent 65 is too large"),
    ("2 ** -65", "the exponent -65 is too large"),
    ("10 ** 64 * 10 ** 64", "too large"),
    ("9.9e307 * 10", "too large"),
    ("1 / 0", "division by zero"),
    ("1 // 0", "division by zero"),
    ("1 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("2 +", "not an arithmetic expression"),
    ("1" * 201, "the limit is 200"),
])
def test_everything_outside_the_grammar_or_the_limits_is_an_error_result(expression, reason):
    result = calculate(expression)
    assert result.error and reason in result.text, result


def test_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "ran"
    result = calculate(f"__import__('os').system('touch {marker}')")
    assert result.error and "is not allowed" in result.text
    assert not marker.exists()


@pytest.mark.parametrize("arguments", [{}, {"expression": 12}, {"expr": "1 + 1"}])
def test_a_missing_or_non_string_expression_is_an_error_result(arguments):
    calculator = build_tools(["calculator"], {})["calculator"]
    result = asyncio.run(calculator.call(arguments, {}))
    assert result.error and '"expression"' in result.text
