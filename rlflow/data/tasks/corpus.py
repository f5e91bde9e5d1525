"""The text rlflow's preset tokenizer is trained on: synthetic-task chats, then general ASCII.

``tokenizer_corpus()`` is passed to ``rlflow.models.presets.build_preset`` (and to
``rlflow.models.ensure.ensure_model``) by the drivers, the preset command line and the tests.
Training on the task text makes prompts and worked solutions encode in few tokens. The stream
is fixed (seeded, from a fixed task list with default options), so the presets' tokenizer and
its token ids never change unless this file or those tasks do.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

from rlflow.data.tasks import build_task

_GENERAL_TEXT = """\
The quick brown fox jumps over the lazy dog. A model reads text as tokens and predicts the next one.
You are a helpful assistant. Please think step by step, then give the final answer.
Question: how many apples are left if you start with 12 and eat 5? Answer: 7.
Reinforcement learning from rewards improves a policy; the reward says whether the answer is right.
def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5
{"role": "user", "content": "hello"} [1, 2, 3] (x + y) * z / 4 - 1 = 0; x != y, a <= b, c >= d.
"""

_CORPUS_SEED = 1234
_EXAMPLES_PER_TASK = 2000
# A fixed list, not the live registry: registering a new task must not change existing presets.
CORPUS_TASKS = ("addition", "chain_arith")


def tokenizer_corpus() -> Iterator[str]:
    """The corpus lines: chat-shaped text from ``CORPUS_TASKS`` (default options), then general ASCII."""
    rng = random.Random(_CORPUS_SEED)
    for name in CORPUS_TASKS:
        task = build_task(name)
        for _ in range(_EXAMPLES_PER_TASK):
            example = task.sample(rng)
            yield f"user\n{example.prompt}\n"
            yield f"assistant\n{example.solution}\n"
    yield from _GENERAL_TEXT.splitlines(keepends=True)
    yield string.printable
