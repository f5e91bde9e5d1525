"""The synthetic-task command: ``rlflow-data task NAME --out DIR --train N --val M [--seed S] [--digits D ...]``.

The same code also serves ``python -m rlflow.data.tasks --task NAME ...`` (the task given as a flag).
Every option of every registered task is a flag (``--digits``, ``--num-ops``, ...); a flag the
chosen task does not have is an error. Flags left out keep the task's defaults.
"""

from __future__ import annotations

import argparse
import typing

from rlflow.data.tasks.base import TASK_REGISTRY, build_task, task_option_names
from rlflow.data.tasks.files import write_task_files


def _task_option_types() -> dict[str, type]:
    """Every option name across the registered tasks, with its type."""
    types: dict[str, type] = {}
    for cls in map(TASK_REGISTRY.get, TASK_REGISTRY.names()):
        hints = typing.get_type_hints(cls)
        for name in task_option_names(cls):
            types.setdefault(name, hints[name])
    return types


def add_task_arguments(parser: argparse.ArgumentParser, task_as_flag: bool) -> None:
    """The task command's arguments: the task name (positional, or ``--task`` when ``task_as_flag``) and its options."""
    if task_as_flag:
        parser.add_argument("--task", required=True, choices=TASK_REGISTRY.names(), help="which synthetic task")
    else:
        parser.add_argument("task", choices=TASK_REGISTRY.names(), help="which synthetic task")
    parser.add_argument("--out", required=True, help="output folder for the parquet files")
    parser.add_argument("--train", type=int, required=True, help="number of train examples")
    parser.add_argument("--val", type=int, required=True, help="number of val examples")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    options = parser.add_argument_group("task options (defaults depend on the task)")
    for name, option_type in _task_option_types().items():
        flag = f"--{name.replace('_', '-')}"
        options.add_argument(flag, dest=name, type=option_type, default=None, help=f"task option {name}")
    add_overwrite_argument(parser)
    parser.set_defaults(run=write_task_from_args)


def add_overwrite_argument(parser: argparse.ArgumentParser) -> None:
    """``--overwrite``: replace files an earlier rlflow-data run wrote into ``--out`` (never anyone else's)."""
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files an earlier rlflow-data run wrote in --out (a file it did not write is never replaced)")


def write_task_from_args(args: argparse.Namespace) -> None:
    """Generate the task files the parsed arguments ask for and print where they went (errors raise ``ValueError``)."""
    options = {name: getattr(args, name) for name in _task_option_types() if getattr(args, name) is not None}
    task = build_task(args.task, **options)
    written = write_task_files(task, args.out, n_train=args.train, n_val=args.val, seed=args.seed, overwrite=args.overwrite)
    print(f"{task.data_source} {task.options()} seed={args.seed}: train={args.train} val={args.val}")
    for key, path in written.items():
        print(f"  {key}: {path}")
