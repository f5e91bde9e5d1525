"""Arithmetic tasks: multi-digit addition and short add/subtract chains.

Prompts share one phrasing, "What is <expression>? Answer with the number after ####.", so a
tokenizer trained on them encodes the fixed words in a few tokens, and worked solutions show
each step on its own line before the final ``#### <answer>`` line.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlflow.data.tasks.answer import ANSWER_MARKER
from rlflow.data.tasks.base import TASK_REGISTRY, SyntheticTask, TaskExample


def arithmetic_prompt(expression: str) -> str:
    """The user prompt for an arithmetic expression."""
    return f"What is {expression}? Answer with the number after {ANSWER_MARKER}."


def worked_solution(steps: list[str], answer: int) -> str:
    """Solution text: one step per line, then the final answer line."""
    return "\n".join([*steps, f"{ANSWER_MARKER} {answer}"])


def check_positive(task: str, **values: int) -> None:
    """Raise ``ValueError`` naming ``task`` and the option unless every option value is a positive integer."""
    for key, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"synthetic task {task!r}: option {key} must be a positive integer, got {value!r}")


@TASK_REGISTRY.register("addition")
@dataclass(frozen=True)
class AdditionTask(SyntheticTask):
    """a+b with both operands drawn uniformly from [0, 10**digits)."""

    digits: int = 3

    def __post_init__(self) -> None:
        check_positive(self.name, digits=self.digits)

    def sample(self, rng: random.Random) -> TaskExample:
        high = 10**self.digits - 1
        a, b = rng.randint(0, high), rng.randint(0, high)
        total = a + b
        return TaskExample(
            prompt=arithmetic_prompt(f"{a}+{b}"),
            ground_truth=str(total),
            solution=worked_solution([f"{a}+{b}={total}"], total),
        )


@TASK_REGISTRY.register("chain_arith")
@dataclass(frozen=True)
class ChainArithTask(SyntheticTask):
    """A chain of ``num_ops`` additions/subtractions on numbers below 10**digits, evaluated left to right.

    A subtrahend never exceeds the running value, so every intermediate result (and the answer)
    is non-negative; the worked solution writes one partial result per line.
    """

    digits: int = 2
    num_ops: int = 2

    def __post_init__(self) -> None:
        check_positive(self.name, digits=self.digits, num_ops=self.num_ops)

    def sample(self, rng: random.Random) -> TaskExample:
        high = 10**self.digits - 1
        value = rng.randint(0, high)
        expression, steps = str(value), []
        for _ in range(self.num_ops):
            if rng.random() < 0.5:
                operand = rng.randint(0, high)
                step = f"{value}+{operand}={value + operand}"
                expression += f"+{operand}"
                value += operand
            else:
                operand = rng.randint(0, min(value, high))
                step = f"{value}-{operand}={value - operand}"
                expression += f"-{operand}"
                value -= operand
            steps.append(step)
        return TaskExample(
            prompt=arithmetic_prompt(expression),
            ground_truth=str(value),
            solution=worked_solution(steps, value),
        )
