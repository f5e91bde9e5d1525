"""The ``calculator`` tool: arithmetic on numbers, evaluated by walking Python's ``ast``.

The grammar is Python's expression syntax restricted to int and float literals, the binary operators
``+ - * / // % **``, unary ``+``/``-`` and parentheses. Nothing is ever passed to ``eval``: names,
calls, attributes, subscripts, strings and every other node are refused. Limits keep one call cheap:
at most ``MAX_LENGTH`` characters, exponents of at most ``MAX_EXPONENT`` in magnitude, and no
intermediate result beyond ``MAX_MAGNITUDE``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Union

from rlflow.rollout.agent.tools.base import TOOL_REGISTRY, Tool, ToolResult

Number = Union[int, float]

MAX_LENGTH = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100
SIGNIFICANT_DIGITS = 10
GRAMMAR = "the calculator takes numbers, + - * / // % ** and parentheses"

BINARY: dict[type[ast.operator], Callable[[Number, Number], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculationError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is for the model."""


def evaluate(expression: str) -> Number:
    """The value of ``expression``; anything outside the grammar or the limits raises ``CalculationError``."""
    if len(expression) > MAX_LENGTH:
        raise CalculationError(f"the expression has {len(expression)} characters; the limit is {MAX_LENGTH}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculationError(f"not an arithmetic expression ({error.msg}); {GRAMMAR}") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> Number:
    evaluator = EVALUATORS.get(type(node))
    if evaluator is None:
        raise CalculationError(f"`{_snippet(node)}` is not allowed: {GRAMMAR}")
    return evaluator(node)


def _constant(node: ast.Constant) -> Number:
    if type(node.value) not in (int, float):  # bool, complex, str, bytes, None, ...
        raise CalculationError(f"`{_snippet(node)}` is not a number: {GRAMMAR}")
    return _bounded(node.value)


def _binary(node: ast.BinOp) -> Number:
    apply = BINARY.get(type(node.op))
    if apply is None:
        raise CalculationError(f"`{_snippet(node)}` uses an operator that is not allowed: {GRAMMAR}")
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise CalculationError(f"the exponent {right} is too large; the limit is {MAX_EXPONENT} in magnitude")
    try:
        return _bounded(apply(left, right))
    except ZeroDivisionError:
        raise CalculationError(f"division by zero in `{_snippet(node)}`") from None
    except OverflowError:
        raise CalculationError(f"`{_snippet(node)}` is too large; the limit is {MAX_MAGNITUDE:g}") from None


def _unary(node: ast.UnaryOp) -> Number:
    apply = UNARY.get(type(node.op))
    if apply is None:
        raise CalculationError(f"`{_snippet(node)}` uses an operator that is not allowed: {GRAMMAR}")
    return apply(_evaluate(node.operand))


EVALUATORS: dict[type[ast.AST], Callable[[Any], Number]] = {
    ast.Constant: _constant, ast.BinOp: _binary, ast.UnaryOp: _unary,
}


def _bounded(value: Any) -> Number:
    if not isinstance(value, (int, float)):  # a negative number to a fractional power is complex
        raise CalculationError(f"the result {value} is not a real number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError(f"a result is too large; the limit is {MAX_MAGNITUDE:g} in magnitude")
    return value


def _snippet(node: ast.AST, limit: int = 40) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def format_number(value: Number) -> str:
    """An int as it is (``"123456"``); a float with up to 10 significant digits, no trailing zeros."""
    if isinstance(value, int):
        return str(value)
    return f"{value + 0.0:.{SIGNIFICANT_DIGITS}g}"  # + 0.0 turns -0.0 into 0.0


@TOOL_REGISTRY.register("calculator")
class Calculator(Tool):
    """Evaluates one arithmetic expression."""

    description = "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the expression, e.g. (12 + 30) * 2 ** 3"}},
        "required": ["expression"],
    }

    async def call(self, arguments: dict[str, Any], row_kwargs: dict[str, Any]) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult('the calculator needs a string argument "expression"', error=True)
        try:
            return ToolResult(format_number(evaluate(expression)))
        except CalculationError as error:
            return ToolResult(str(error), error=True)
