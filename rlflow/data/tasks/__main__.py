"""Command line: ``python -m rlflow.data.tasks --task addition --out DIR --train N --val M --seed S [--digits D]``.

Every option of every registered task is a flag (``--digits``, ``--num-ops``, ...); a flag the
chosen task does not have is an error. Flags left out keep the task's defaults.
"""

from __future__ import annotations

import argparse
import sys
import typing

from rlflow.data.tasks import TASK_REGISTRY, build_task, task_option_names, write_task_files


def _task_option_types() -> dict[str, type]:
    """Every option name across the registered tasks, with its type."""
    types: dict[str, type] = {}
    for cls in map(TASK_REGISTRY.get, TASK_REGISTRY.names()):
        hints = typing.get_type_hints(cls)
        for name in task_option_names(cls):
            types.setdefault(name, hints[name])
    return types


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with one flag per task option across all registered tasks."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.data.tasks", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=TASK_REGISTRY.names(), help="which synthetic task")
    parser.add_argument("--out", required=True, help="output folder for the parquet files")
    parser.add_argument("--train", type=int, required=True, help="number of train examples")
    parser.add_argument("--val", type=int, required=True, help="number of val examples")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    options = parser.add_argument_group("task options (defaults depend on the task)")
    for name, option_type in _task_option_types().items():
        flag = f"--{name.replace('_', '-')}"
        options.add_argument(flag, dest=name, type=option_type, default=None, help=f"task option {name}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, generate the task files and print where they went."""
    args = build_parser().parse_args(argv)
    options = {name: getattr(args, name) for name in _task_option_types() if getattr(args, name) is not None}
    try:
        task = build_task(args.task, **options)
        written = write_task_files(task, args.out, n_train=args.train, n_val=args.val, seed=args.seed)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{task.data_source} {task.options()} seed={args.seed}: train={args.train} val={args.val}")
    for key, path in written.items():
        print(f"  {key}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
