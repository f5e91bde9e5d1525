"""rlflow-from-verl: a verl launch script (or a list of verl overrides) as an rlflow command, checked.

    rlflow-from-verl SCRIPT [--device auto|cpu|cuda] [--entry ppo|sft] [--validate]

``SCRIPT`` is a verl example script such as ``examples/grpo_trainer/run_deepseek7b_llm.sh``, a file of
``key=value`` overrides, or ``-`` for standard input. The output (stdout) is a shell script: comments
listing every verl argument not carried over (with the reason and what to do), every value converted,
and every value written out that verl would have taken without the script saying so; then the
``rlflow-ppo`` / ``rlflow-sft`` command. The translation is then validated as the entry point would
load it (keys, types, choices, engines, dtypes); ``--validate`` adds the checks that need the model
and data files (``--validate`` on the entry point itself). Problems print one ``error:`` line each
and exit with status 2. ``--device`` is where the run will go (auto: a GPU if this machine has one):
on a CPU, verl's GPU memory fraction has no meaning and is left out.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlflow.config.loading.entry_point import EntryPoint
from rlflow.config.loading.hydra_entry import print_user_error
from rlflow.config.loading.verl_translate import Translation, translate
from rlflow.config.verl_script import read_verl_command
from rlflow.errors import UserError
from rlflow.trainer.entry_points import PPO_ENTRY, SFT_ENTRY
from rlflow.utils.device import is_accelerator_available

ENTRIES: dict[str, EntryPoint] = {"ppo_trainer": PPO_ENTRY, "sft_trainer": SFT_ENTRY}
ENTRY_FLAGS = {"ppo": "ppo_trainer", "sft": "sft_trainer"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlflow-from-verl", description=__doc__.splitlines()[0])
    parser.add_argument("script", help="a verl launch script or a file of key=value overrides ('-': standard input)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the rlflow run will go (auto: a GPU if this machine has one)")
    parser.add_argument("--entry", choices=sorted(ENTRY_FLAGS), default=None,
                        help="the entry point for an override list (a script names its own)")
    parser.add_argument("--validate", action="store_true",
                        help="also run the checks that need the model and data files, as the entry point's --validate")
    return parser


def check(translation: Translation, with_files: bool) -> None:
    """Load the translation as its entry point would (and with ``with_files`` run its pre-Ray checks); UserError if not."""
    entry = ENTRIES[translation.entry]
    config = entry.compose(translation.overrides)
    if with_files and entry.preflight is not None:
        entry.preflight(config)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        text = sys.stdin.read() if args.script == "-" else Path(args.script).read_text()
    except OSError as error:
        print(f"error: cannot read {args.script}: {error.strerror}", file=sys.stderr)
        sys.exit(2)
    device = args.device if args.device != "auto" else "cuda" if is_accelerator_available() else "cpu"
    try:
        command = read_verl_command(text, os.environ)
        translation = translate(command, device, ENTRY_FLAGS.get(args.entry))
        print(translation.script(args.script), end="", flush=True)
        check(translation, args.validate)
    except UserError as error:
        print_user_error(error)
        sys.exit(2)
    checked = "every pre-Ray check" if args.validate else "keys, types, choices and engines; --validate checks the files too"
    print(f"the translation validates ({checked})", file=sys.stderr)


if __name__ == "__main__":
    main()
