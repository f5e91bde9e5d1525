"""``tool_product``: a product of multi-digit numbers, solved by calling the calculator tool.

The tiny preset cannot multiply two 3-digit numbers in its head; with the ``calculator`` tool it only has to
copy the expression into a call and the tool's result into its answer. The SFT trace shows the Hermes
tool-call format (``<tool_call>{"name": "calculator", "arguments": {...}}</tool_call>``, the one
``rollout.multi_turn.format=hermes`` reads), the tool's answer as a ``tool`` message, and the final answer
after ``####``. With ``direct_percent`` > 0 that share of the SFT traces answer at once instead, without the
tool (a guess the model cannot make reliably), so the warm start calls the tool only sometimes and RL has a
decision to learn. RL rows name the ``tool_agent`` loop (``agent_name``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from rlflow.data.tasks.answer import ANSWER_MARKER
from rlflow.data.tasks.arithmetic import check_positive
from rlflow.data.tasks.base import TASK_REGISTRY, SyntheticTask, TaskExample

CALCULATOR = "calculator"


def tool_call_text(name: str, arguments: dict) -> str:
    """An assistant turn that calls one tool, in the Hermes format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@TASK_REGISTRY.register("tool_product")
@dataclass(frozen=True)
class ToolProductTask(SyntheticTask):
    """The product of ``operands`` numbers of ``digits`` digits each (no leading zero); ``direct_percent`` of the
    SFT traces answer without calling the tool."""

    digits: int = 3
    operands: int = 2
    direct_percent: int = 0
    ability = "tool_use"
    agent_name = "tool_agent"

    def __post_init__(self) -> None:
        check_positive(self.name, digits=self.digits, operands=self.operands)
        if not 0 <= self.direct_percent <= 100:
            raise ValueError(f"synthetic task {self.name!r}: option direct_percent must be in [0, 100], "
                             f"got {self.direct_percent!r}")

    def sample(self, rng: random.Random) -> TaskExample:
        numbers = [rng.randint(10 ** (self.digits - 1), 10**self.digits - 1) for _ in range(self.operands)]
        expression = "*".join(str(n) for n in numbers)
        answer = 1
        for number in numbers:
            answer *= number
        call = tool_call_text(CALCULATOR, {"expression": expression})
        final = f"{ANSWER_MARKER} {answer}"
        direct = rng.randrange(100) < self.direct_percent
        turns = () if direct else ({"role": "assistant", "content": call}, {"role": "tool", "content": str(answer)},
                                   {"role": "assistant", "content": final})
        return TaskExample(
            prompt=f"What is {expression}? Use the calculator, then answer with the number after {ANSWER_MARKER}.",
            ground_truth=str(answer),
            solution=final,
            turns=turns,
        )
