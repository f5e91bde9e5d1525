"""rlflow-data: make RL and SFT data files.

    rlflow-data task NAME --out DIR --train N --val M [--seed S] [task options]   synthetic task files
    rlflow-data gsm8k --src FILE_OR_FOLDER --out DIR [--split NAME]              GSM8K -> verl parquet
    rlflow-data math  --src FILE_OR_FOLDER --out DIR [--split NAME]              MATH  -> verl parquet

A file in DIR that rlflow-data did not write is never replaced; its own earlier output only with
--overwrite (``rlflow.data.outputs``). Errors in the input print one ``error:`` line and exit with
status 2, before any work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlflow.data.converters import CONVERTER_REGISTRY, SPLIT_WORDS, convert_sources
from rlflow.data.tasks.cli import add_overwrite_argument, add_task_arguments
from rlflow.errors import UserError


def _add_converter_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--src", required=True, nargs="+", type=Path,
                        help="local dataset files or folders (.parquet, .jsonl, .json)")
    parser.add_argument("--out", required=True, type=Path, help="output folder: one <split>.parquet per split")
    parser.add_argument("--split", default=None,
                        help=f"the split of every source file (default: read from the file names: {', '.join(SPLIT_WORDS)})")
    add_overwrite_argument(parser)
    parser.set_defaults(run=lambda args: _convert(name, args))


def _convert(name: str, args: argparse.Namespace) -> None:
    converter = CONVERTER_REGISTRY.get(name)()
    written = convert_sources(converter, args.src, args.out, args.split, args.overwrite)
    print(f"{name}: data_source={converter.data_source}")
    for split, (path, count) in written.items():
        print(f"  {split}: {count} rows -> {path}")


def build_parser() -> argparse.ArgumentParser:
    """The ``rlflow-data`` parser: the ``task`` command and one command per registered converter."""
    parser = argparse.ArgumentParser(prog="rlflow-data", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_task_arguments(commands.add_parser("task", help="write a synthetic task's RL and SFT files"), task_as_flag=False)
    for name in CONVERTER_REGISTRY.names():
        doc = (CONVERTER_REGISTRY.get(name).__doc__ or "").strip().splitlines()[0].replace("``", "")
        _add_converter_arguments(commands.add_parser(name, help=f"convert {doc}"), name)
    return parser


def _run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``rlflow-data`` console script; returns the exit status."""
    return _run(build_parser(), argv)


def tasks_module_main(argv: list[str] | None = None) -> int:
    """``python -m rlflow.data.tasks``: the ``task`` command with the task named by ``--task``."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.data.tasks", description="Write a synthetic task's files.")
    add_task_arguments(parser, task_as_flag=True)
    return _run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
