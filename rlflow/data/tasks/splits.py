"""Turning a task's problem stream into disjoint train/val splits and verl-format rows."""

from __future__ import annotations

import random
from typing import Any

from rlflow.data.tasks.base import SyntheticTask, TaskExample

# How many draws in a row may repeat an already-seen prompt before we conclude the task's
# problem space is too small for the requested split sizes.
_MAX_CONSECUTIVE_REPEATS = 10_000


def generate_splits(task: SyntheticTask, n_train: int, n_val: int, seed: int) -> tuple[list[TaskExample], list[TaskExample]]:
    """``n_train`` and ``n_val`` distinct problems (no prompt appears twice, in or across splits).

    Val is drawn first from the seed's stream, so the val split depends only on (task, seed,
    n_val): growing the train split never changes val.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be >= 0, got train={n_train} val={n_val}")
    rng = random.Random(seed)
    seen: set[str] = set()
    examples: list[TaskExample] = []
    repeats = 0
    while len(examples) < n_val + n_train:
        example = task.sample(rng)
        if example.prompt in seen:
            repeats += 1
            if repeats >= _MAX_CONSECUTIVE_REPEATS:
                raise ValueError(
                    f"synthetic task {task.name!r} with options {task.options()} found only {len(examples)} distinct "
                    f"problems, fewer than train+val={n_train + n_val}; lower --train/--val or make the task larger "
                    "(e.g. more --digits)"
                )
            continue
        repeats = 0
        seen.add(example.prompt)
        examples.append(example)
    return examples[n_val:], examples[:n_val]


def rl_row(task: SyntheticTask, example: TaskExample, split: str, index: int) -> dict[str, Any]:
    """One row in verl's RL format (data_source, prompt, ability, reward_model, extra_info; and agent_name when
    the task names its agent loop)."""
    row = {
        "data_source": task.data_source,
        "prompt": [{"role": "user", "content": example.prompt}],
        "ability": task.ability,
        "reward_model": {"style": "rule", "ground_truth": example.ground_truth},
        "extra_info": _extra_info(task, example, split, index),
    }
    if task.agent_name:
        row["agent_name"] = task.agent_name
    return row


def sft_row(task: SyntheticTask, example: TaskExample, split: str, index: int) -> dict[str, Any]:
    """One SFT row: the chat in ``messages``: the prompt, then the example's turns (or the worked solution)."""
    turns = [dict(turn) for turn in example.turns] or [{"role": "assistant", "content": example.solution}]
    return {
        "data_source": task.data_source,
        "messages": [{"role": "user", "content": example.prompt}, *turns],
        "extra_info": _extra_info(task, example, split, index),
    }


def _extra_info(task: SyntheticTask, example: TaskExample, split: str, index: int) -> dict[str, Any]:
    return {"split": split, "index": index, "task": task.name, "solution": example.solution}
