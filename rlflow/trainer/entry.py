"""What every Hydra entry point shares: argv shorthands, config validation, one-line user errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import hydra
from omegaconf import DictConfig

from rlflow.errors import UserError
from rlflow.utils.device import limit_cpu_threads

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


def expand_group_shorthands(argv: list[str], group_mounts: dict[str, str]) -> list[str]:
    """Let users write ``actor.engine=fsdp`` for Hydra's ``engine@actor.engine=fsdp``.

    ``group_mounts`` maps a mount key (``actor.engine``) to its group (``engine``).
    Only bare option names are rewritten; ``actor.engine.lr=1e-5`` is left alone.
    """
    expanded = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in group_mounts and value.replace("_", "").isalnum():
            arg = f"{group_mounts[key]}@{key}={value}"
        expanded.append(arg)
    return expanded


def run_hydra_entry(
    config_name: str,
    run: Callable[[DictConfig], None],
    group_mounts: dict[str, str] | None = None,
) -> None:
    """Parse the command line with Hydra, then call ``run(cfg)``; ``UserError`` exits 2 with one line.

    The controller itself runs one torch thread: it only moves batches and does cheap batch math,
    and a second thread on a loaded small machine made its tensor work many times slower.
    """
    limit_cpu_threads(1)
    sys.argv = [sys.argv[0], *expand_group_shorthands(sys.argv[1:], group_mounts or {})]

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base=None)
    def _main(cfg: DictConfig) -> None:
        try:
            run(cfg)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    _main()
