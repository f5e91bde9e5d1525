"""Synthetic verifiable tasks: registered problem generators with a final-answer ``score``.

``build_task("addition", digits=3)`` makes a generator; ``write_task_files`` writes its
train/val parquet in verl's RL format plus SFT chat files; ``score(task, solution, truth)``
is the rule reward. ``python -m rlflow.data.tasks --help`` is the command-line entry.
"""

from rlflow.data.tasks import arithmetic, tool_arith  # noqa: F401  (registers the tasks)
from rlflow.data.tasks.answer import ANSWER_MARKER, extract_final_answer, score_final_answer
from rlflow.data.tasks.base import (
    DATA_SOURCE_PREFIX,
    TASK_REGISTRY,
    SyntheticTask,
    TaskExample,
    build_task,
    get_task_cls,
    score,
    task_option_names,
)
from rlflow.data.tasks.files import RL_FILES, SFT_FILES, write_task_files
from rlflow.data.tasks.splits import generate_splits, rl_row, sft_row

__all__ = [
    "ANSWER_MARKER",
    "DATA_SOURCE_PREFIX",
    "RL_FILES",
    "SFT_FILES",
    "TASK_REGISTRY",
    "SyntheticTask",
    "TaskExample",
    "build_task",
    "extract_final_answer",
    "generate_splits",
    "get_task_cls",
    "rl_row",
    "score",
    "score_final_answer",
    "sft_row",
    "task_option_names",
    "write_task_files",
]
