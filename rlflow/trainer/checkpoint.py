"""Run checkpoints: worker checkpoints plus driver state, one atomic folder per saved step.

Layout under ``trainer.default_local_dir``::

    global_step_N/
        actor/ critic/ ...      each role's engine checkpoint (written by its workers)
        driver_state.pt         step, data-loader position, KL controller, RNG, divergence-guard counts
    latest_checkpointed_iteration.txt

A step is written into ``global_step_N.partial`` and renamed only when every part is on
disk, so an interrupted save never shadows the previous checkpoint. On a multi-node
cluster ``default_local_dir`` must be storage every node sees.

Durability and recovery:

* every file and folder of the step is fsynced before the rename, the run folder after it,
  and ``latest_checkpointed_iteration.txt`` is replaced atomically;
* ``fingerprint.json`` (``fingerprint``) records the run's math and ``manifest.json``
  (``checkpoint_manifest``) the size of every file;
* a save that fails (a full disk: ``ENOSPC``/``EDQUOT``/``EFBIG``) removes its partial folder
  and raises ``CheckpointError``; the previous checkpoint is untouched;
* resuming picks the newest checkpoint that passes the driver-side checks (driver state loads,
  the manifest matches) and warns, naming each newer one it skips;
* pruning (``max_to_keep``) runs after the new checkpoint is complete and deletes only
  checkpoints older than it, so the newest one is never deleted.
"""

from __future__ import annotations

import errno
import re
import shutil
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from rlflow.config.schema import RESUME_MODES
from rlflow.errors import CheckpointError
from rlflow.trainer.checkpoint_manifest import manifest_problem, write_manifest
from rlflow.trainer.fingerprint import fingerprint_differences, read_fingerprint, run_fingerprint, write_fingerprint
from rlflow.utils.durable import fsync_path, fsync_tree, write_atomic
from rlflow.utils.logging import get_logger
from rlflow.utils.safe_io import load_weights_only

LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver_state.pt"
PARTIAL_SUFFIX = ".partial"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# A save that fails with one of these (or a worker error naming one) is reported as a full disk.
_DISK_FULL = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded", errno.EFBIG: "File too large"}
logger = get_logger(__name__)


class CheckpointManager:
    """Writes, finds, loads and prunes the ``global_step_N`` folders of one run.

    ``fingerprint_of`` computes the run's fingerprint (``fingerprint.run_fingerprint``), once,
    when it is first needed: it is written into every checkpoint and compared with the one a
    resumed checkpoint holds.
    """

    def __init__(self, root: str | Path, max_to_keep: Optional[int] = None,
                 fingerprint_of: Optional[Callable[[], dict[str, Any]]] = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self._fingerprint_of = fingerprint_of

    @cached_property
    def fingerprint(self) -> Optional[dict[str, Any]]:
        return self._fingerprint_of() if self._fingerprint_of is not None else None

    @classmethod
    def for_run(cls, config: Any) -> "CheckpointManager":
        """The manager of a driver's run: ``trainer.default_local_dir``, ``max_ckpt_to_keep``, the run's fingerprint."""
        return cls(config.trainer.default_local_dir, config.trainer.max_ckpt_to_keep, lambda: run_fingerprint(config))

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def save(self, step: int, driver_state: dict[str, Any], save_workers: Callable[[Path], None]) -> Path:
        """Write ``global_step_{step}``: ``save_workers(partial_dir)`` writes the roles, then the driver state."""
        final = self.step_dir(step)
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            partial.mkdir(parents=True)
            save_workers(partial)
            torch.save(driver_state, partial / DRIVER_STATE)
            if self.fingerprint is not None:
                write_fingerprint(partial, self.fingerprint)
            write_manifest(partial, step)
            fsync_tree(partial)
        except Exception as error:
            shutil.rmtree(partial, ignore_errors=True)
            failure = self._save_failed(step, error)
            if failure is error:
                raise
            raise failure from error
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        fsync_path(self.root)
        write_atomic(self.root / LATEST_FILE, str(step))
        self._prune(step)
        return final

    def _save_failed(self, step: int, error: Exception) -> Exception:
        """A full disk becomes a one-line ``CheckpointError``; anything else is re-raised as it is."""
        text = str(error)
        reason = _DISK_FULL.get(getattr(error, "errno", None)) or next((r for r in _DISK_FULL.values() if r in text), None)
        if reason is None:
            return error
        previous = self.complete_steps()
        kept = f"the previous checkpoint {self.step_dir(previous[-1])} is intact" if previous else "no earlier checkpoint exists"
        return CheckpointError(f"saving checkpoint global_step_{step} in {self.root} failed: {reason}; {kept}. "
                               f"Free space there (or lower trainer.max_ckpt_to_keep) and resume")

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
        """The newest complete checkpoint that passes the driver-side checks, or None.

        Each newer one that fails them is skipped with a warning naming it and why; if every
        checkpoint fails, ``CheckpointError`` (resuming nothing would silently restart the run).
        """
        steps = self.complete_steps()
        for step in reversed(steps):
            folder = self.step_dir(step)
            problem = self.problem(folder)
            if problem is None:
                return folder
            logger.warning("checkpoint %s cannot be loaded (%s); falling back to the previous one", folder, problem)
        if steps:
            raise CheckpointError(f"no loadable checkpoint in {self.root} (each one failed its checks, see the warnings); "
                                  f"set trainer.resume_mode=disable to start over or trainer.default_local_dir to a new folder")
        return None

    def problem(self, folder: Path) -> Optional[str]:
        """Why ``folder`` cannot be resumed from (driver state unreadable, a file missing or cut short), or None."""
        problem = manifest_problem(folder)
        if problem is not None:
            return problem
        try:
            self.load_driver_state(folder)
        except Exception as error:  # any unpickling/zip error: the file is corrupt
            return f"{DRIVER_STATE} is unreadable: {type(error).__name__}: {error}"
        return None

    def resolve(self, resume_mode: str, resume_from_path: Optional[str]) -> Optional[Path]:
        """The folder to resume from under ``trainer.resume_mode`` (auto | force | disable | path).

        ``auto`` refuses a checkpoint whose fingerprint differs from this run's (CheckpointError
        naming the keys); ``force`` and ``path`` resume it with a warning.
        """
        modes = {
            "disable": lambda: None,
            "auto": self.latest,
            "force": self.latest,
            "path": lambda: self._checked_path(resume_from_path),
        }
        if resume_mode not in RESUME_MODES:
            raise CheckpointError(f"config key 'trainer.resume_mode': {resume_mode!r} is not one of {list(RESUME_MODES)}")
        folder = modes[resume_mode]()
        if folder is not None:
            self._check_fingerprint(folder, strict=resume_mode == "auto")
        return folder

    def _check_fingerprint(self, folder: Path, strict: bool) -> None:
        saved = read_fingerprint(folder)
        if saved is None or self.fingerprint is None:
            return
        differences = fingerprint_differences(saved, self.fingerprint)
        if not differences:
            return
        text = f"checkpoint {folder} was written by a run with other settings: {'; '.join(differences)}"
        if strict:
            raise CheckpointError(f"{text}. Resume with the same settings, set trainer.resume_mode=force to resume anyway, "
                                  f"or point trainer.default_local_dir at a new folder")
        logger.warning("%s; resuming it anyway (trainer.resume_mode)", text)

    def _checked_path(self, path: Optional[str]) -> Path:
        if not path:
            raise CheckpointError("trainer.resume_mode=path needs trainer.resume_from_path=<global_step_N folder>")
        folder = Path(path)
        if not (folder / DRIVER_STATE).is_file():
            raise CheckpointError(f"trainer.resume_from_path: {folder} is not a complete checkpoint (no {DRIVER_STATE})")
        problem = self.problem(folder)
        if problem is not None:
            raise CheckpointError(f"trainer.resume_from_path: {folder} cannot be loaded: {problem}")
        return folder

    @staticmethod
    def load_driver_state(folder: Path, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """The driver's state of checkpoint ``folder``; one-line ``CheckpointError`` when any of ``keys`` is missing
        (a checkpoint written by an older rlflow)."""
        state = load_weights_only(folder / DRIVER_STATE, CheckpointError)
        missing = [key for key in keys if key not in state]
        if missing:
            raise CheckpointError(
                f"checkpoint {folder}: {DRIVER_STATE} has no {', '.join(missing)} (written by an older rlflow); "
                "start a new trainer.default_local_dir, or set trainer.resume_mode=disable"
            )
        return state

    def _prune(self, saved_step: int) -> None:
        """Keep ``max_to_keep`` checkpoints: the one just saved plus the newest older ones.

        Only checkpoints older than ``saved_step`` are deleted (never the one just completed,
        and never a newer folder left by an earlier run of this folder).
        """
        if not self.max_to_keep or self.max_to_keep < 1:
            return
        older = [step for step in self.complete_steps() if step < saved_step]
        for step in older[: max(len(older) - (self.max_to_keep - 1), 0)]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
