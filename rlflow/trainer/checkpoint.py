"""Run checkpoints: worker checkpoints plus driver state, one atomic folder per saved step.

Layout under ``trainer.default_local_dir``::

    global_step_N/
        actor/ critic/ ...      each role's engine checkpoint (written by its workers)
        driver_state.pt         step, data-loader position, KL controller, RNG
    latest_checkpointed_iteration.txt

A step is written into ``global_step_N.partial`` and renamed only when every part is on
disk, so an interrupted save never shadows the previous checkpoint. On a multi-node
cluster ``default_local_dir`` must be storage every node sees.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from rlflow.errors import CheckpointError

LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver_state.pt"
PARTIAL_SUFFIX = ".partial"
RESUME_MODES = ("auto", "disable", "path")  # trainer.resume_mode values resolve() accepts (config_choices checks them)
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointManager:
    """Writes, finds, loads and prunes the ``global_step_N`` folders of one run."""

    def __init__(self, root: str | Path, max_to_keep: Optional[int] = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def save(self, step: int, driver_state: dict[str, Any], save_workers: Callable[[Path], None]) -> Path:
        """Write ``global_step_{step}``: ``save_workers(partial_dir)`` writes the roles, then the driver state."""
        final = self.step_dir(step)
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        save_workers(partial)
        torch.save(driver_state, partial / DRIVER_STATE)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _write_atomic(self.root / LATEST_FILE, str(step))
        self._prune()
        return final

    def complete_steps(self) -> list[int]:
        """Steps with a finished checkpoint folder, oldest first."""
        if not self.root.is_dir():
            return []
        steps = []
        for child in self.root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / DRIVER_STATE).is_file():
                steps.append(int(match.group(1)))
        return sorted(steps)

    def latest(self) -> Optional[Path]:
        """The newest complete checkpoint folder, or None."""
        steps = self.complete_steps()
        return self.step_dir(steps[-1]) if steps else None

    def resolve(self, resume_mode: str, resume_from_path: Optional[str]) -> Optional[Path]:
        """The folder to resume from under ``trainer.resume_mode`` (auto | disable | path)."""
        modes = {
            "disable": lambda: None,
            "auto": self.latest,
            "path": lambda: _checked_path(resume_from_path),
        }
        if resume_mode not in modes:
            raise CheckpointError(f"config key 'trainer.resume_mode': {resume_mode!r} is not one of {sorted(modes)}")
        return modes[resume_mode]()

    @staticmethod
    def load_driver_state(folder: Path) -> dict[str, Any]:
        return torch.load(folder / DRIVER_STATE, weights_only=False)

    def _prune(self) -> None:
        if not self.max_to_keep or self.max_to_keep < 1:
            return
        for step in self.complete_steps()[: -self.max_to_keep]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)


def _checked_path(path: Optional[str]) -> Path:
    if not path:
        raise CheckpointError("trainer.resume_mode=path needs trainer.resume_from_path=<global_step_N folder>")
    folder = Path(path)
    if not (folder / DRIVER_STATE).is_file():
        raise CheckpointError(f"trainer.resume_from_path: {folder} is not a complete checkpoint (no {DRIVER_STATE})")
    return folder


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
