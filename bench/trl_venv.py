"""The TRL venv ``bench/grpo_vs_trl.py`` runs TRL in: created once (reused when its pins match),
with pinned ``trl`` and ``accelerate`` from PyPI and the SAME torch/transformers as rlflow's venv.

rlflow's site-packages are put on the new venv's ``sys.path`` by one ``.pth`` line, so pip
sees torch, transformers and datasets as installed and downloads only what is missing. The TRL
runner is started with the worktree on ``PYTHONPATH`` so it imports rlflow's reward.

Importable as ``trl_venv`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

# trl 1.16.0 installs against transformers 5.x (checked with pip install --dry-run); accelerate is its one new dependency
PINS = ("trl==1.16.0", "accelerate==1.15.0")
STAMP = "rlflow-bench-pins.txt"
REPO = Path(__file__).resolve().parents[1]


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def ensure_trl_venv(folder: Path) -> Path:
    """The venv's python, creating the venv (one .pth line + pip install of ``PINS``) when needed."""
    python, stamp = venv_python(folder), folder / STAMP
    if python.is_file() and stamp.is_file() and stamp.read_text().split() == list(PINS):
        return python
    print(f"creating the TRL venv at {folder} ({', '.join(PINS)}; torch from {sys.prefix})", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "rlflow_main_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS], check=True)
    stamp.write_text("\n".join(PINS) + "\n")
    return python


def check_same_torch(python: Path) -> str:
    """``torch.__file__`` in the TRL venv; raises if it is not rlflow's torch."""
    import torch

    theirs = subprocess.check_output([str(python), "-c", "import torch; print(torch.__file__)"], text=True).strip()
    if Path(theirs).resolve() != Path(torch.__file__).resolve():
        raise RuntimeError(f"the TRL venv imports torch from {theirs}, not rlflow's {torch.__file__}; delete the venv")
    return theirs


def installed_versions(python: Path, packages: tuple[str, ...] = ("trl", "accelerate")) -> dict[str, str]:
    """The versions of ``packages`` that ``python`` imports (a ``--trl-python`` may hold others than ``PINS``)."""
    code = f"from importlib.metadata import version; print(' '.join(version(p) for p in {list(packages)!r}))"
    found = subprocess.check_output([str(python), "-c", code], text=True).split()
    return dict(zip(packages, found))


def runner_env(threads: int) -> dict[str, str]:
    """The environment of one TRL run: ``threads`` torch threads, the worktree importable (ahead of
    any ``PYTHONPATH`` already set, which stays: ``--trl-python`` may find ``trl`` there)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
