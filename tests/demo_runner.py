"""Runs ``recipes/demo.sh`` as a subprocess, the way ``make demo`` runs it, at reduced size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
DEMO_SCRIPT = REPO / "recipes" / "demo.sh"
# The reduced demo: the full SFT warm start (the GRPO test needs a model in the 10-60% regime)
# and fewer GRPO steps than `make demo`. docs/demo.md has the numbers behind these choices.
KNOBS = {"DEMO_SEED": "0", "DEMO_SFT_STEPS": "200", "DEMO_STEPS": "20"}
RUN_TIMEOUT_S = 1500
# The GRPO run's greedy val accuracy on the demo task (verl's name: data_source synthetic/chain_arith, 1 sample).
VAL_ACCURACY = "val-core/synthetic/chain_arith/reward/mean@1"


@dataclass(frozen=True)
class DemoRun:
    """A finished demo: its output folder, what it printed, and the knobs it ran with."""

    out: Path
    log: str
    knobs: dict[str, str]

    @property
    def grpo_steps(self) -> int:
        return int(self.knobs["DEMO_STEPS"])

    @property
    def sft_steps(self) -> int:
        return int(self.knobs["DEMO_SFT_STEPS"])

    def metrics(self, phase: str) -> list[dict]:
        """The records of ``<out>/<phase>/metrics.jsonl`` in file order."""
        return read_metrics(self.out / phase)


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run folder's ``metrics.jsonl`` in file order."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_demo_script(out: Path, knobs: dict[str, str], log_path: Path) -> str:
    """Run ``recipes/demo.sh`` into ``out`` with ``knobs``, its output to ``log_path``; return that output."""
    return run_recipe(DEMO_SCRIPT, {**knobs, "DEMO_OUT": str(out)}, log_path=log_path)


class RecipeProcess:
    """A recipe script running in the background, its output (stdout and stderr) going to ``log_path``."""

    def __init__(self, script: Path, env_vars: dict[str, str], overrides: Sequence[str], log_path: Path) -> None:
        env = {**os.environ, **env_vars, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.script, self.log_path = script, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as log:  # a file, not a pipe: two runs at once never block on a full pipe
            self.process = subprocess.Popen(["bash", str(script), *overrides], cwd=REPO, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> str:
        """Wait for the run (``RUN_TIMEOUT_S`` at most) and return its output; fail if it failed."""
        try:
            code = self.process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        log = self.log_path.read_text()
        assert code == 0, f"{self.script.name} exited {code}:\n{log[-6000:]}"
        return log

    def kill(self) -> None:
        """Stop the run and everything it started (its Ray cluster included)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def run_recipe(script: Path, env_vars: dict[str, str], overrides: Sequence[str] = (), *, log_path: Path) -> str:
    """Run a recipe script with ``env_vars`` (this interpreter's bin first on PATH) and extra Hydra ``overrides``,
    its output going to ``log_path``; return that output."""
    return RecipeProcess(script, env_vars, overrides, log_path).wait()
