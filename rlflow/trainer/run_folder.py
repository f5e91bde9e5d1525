"""The run folder's start-up checks: one live run per folder, writable outputs, a safe export dir.

``open_run_folder(config)`` runs before Ray starts, in every driver:

* **lock**: ``<default_local_dir>/.rlflow.lock`` is ``flock``-ed for the life of the returned
  ``RunLock`` and holds the owner's pid and host. A second run on the folder is refused with a
  message naming them. The OS drops the lock when the process dies (SIGKILL included), so a
  killed run never blocks its own resume.
* **writability**: ``default_local_dir`` and the export folder's parent are created if missing
  and must accept a file; otherwise one line now, not at the first save hours in.
* **export folder**: ``trainer.export_hf_dir`` is replaced at the end of the run only if it is
  missing, empty, or holds an rlflow export (``hf_export.EXPORT_MARKER``); a user's folder is
  refused here.
* **nothing left behind**: the folders these checks created are removed again when the lock is
  released while they hold nothing but the lock file (a run that failed before it wrote anything,
  e.g. on a bad data file or model folder found after the lock was taken).
* **resume**: the checkpoint ``trainer.resume_mode`` picks is checked now (loadable, same math:
  ``fingerprint``, same model architecture: ``run_intent``), so a refused resume costs no cluster start.

``check_run_folder(config)`` asks the same questions without creating, writing or locking anything
(``--validate``): a missing folder is judged by the closest existing folder above it, and a lock
held by a live run is found by trying it and letting go at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional

from rlflow.engines.common.checkpoint.hf_export import EXPORT_MARKER
from rlflow.errors import UserError
from rlflow.models.ensure import model_folder
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.run_intent import check_same_architecture
from rlflow.utils.log_routing import worker_log_env
from rlflow.utils.output_paths import folder_write_problem

LOCK_FILE = ".rlflow.lock"


class RunFolderError(UserError):
    """The run folder is locked by another run, not writable, or an export would overwrite a user's folder."""


class RunLock:
    """An exclusive ``flock`` on ``<folder>/.rlflow.lock``, held until ``release()`` or process exit.

    ``created``: folders the start-up checks created for this run; ``release`` removes each one that
    holds nothing (the run folder: nothing but the lock file), deepest first.
    """

    def __init__(self, folder: str | Path, created: tuple[Path, ...] = ()):
        self.path = Path(folder) / LOCK_FILE
        self.created = created
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _in_use(self.path.parent, fd)
            os.close(fd)
            raise error from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode() + b"\n")
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays, a stale file locks nothing, unless the run wrote nothing else into a folder
        it created: then the lock file and the empty folders go)."""
        if self._fd is not None:
            self._remove_unused_folders()
            os.close(self._fd)
            self._fd = None

    def _remove_unused_folders(self) -> None:
        folder = self.path.parent
        if folder in self.created and [entry.name for entry in folder.iterdir()] == [LOCK_FILE]:
            self.path.unlink()  # still locked: a run starting now finds the folder gone or takes a fresh lock
        remove_empty_folders(self.created)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


def _in_use(folder: Path, fd: int) -> RunFolderError:
    holder = _read_holder(fd)
    return RunFolderError(f"trainer.default_local_dir {folder} is in use by another run (pid {holder.get('pid', '?')} "
                          f"on host {holder.get('host', '?')}); wait for it to end or set another trainer.default_local_dir")


def check_not_locked(folder: str | Path) -> None:
    """RunFolderError if a live run holds ``folder``'s lock; creates nothing (a missing lock file is no lock)."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(path.parent, fd) from None
    except OSError:
        return  # a file system without locks: open_run_folder names it when the run starts
    finally:
        os.close(fd)


def remove_empty_folders(folders: tuple[Path, ...]) -> None:
    """Remove each of ``folders`` that is empty, deepest first (the others hold what a run wrote: they stay)."""
    for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone
            continue


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def check_writable(folder: str | Path, key: str) -> tuple[Path, ...]:
    """Create ``folder`` if needed and write a probe file into it; RunFolderError naming ``key`` if that fails.
    Returns the folders it created (``folder`` and missing parents)."""
    path = Path(folder)
    created = tuple(parent for parent in (path, *path.parents) if not parent.exists())
    probe = path / f".rlflow-write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise RunFolderError(f"config key '{key}': {path} is not writable ({reason}); "
                             f"fix its permissions or point {key} elsewhere") from None
    return created


def check_creatable(folder: str | Path, key: str) -> tuple[Path, ...]:
    """``check_writable``'s question without creating or writing anything (``folder_write_problem``); returns no
    folder (none is created)."""
    problem = folder_write_problem(folder)
    if problem is not None:
        raise RunFolderError(f"config key '{key}': {Path(folder)} cannot be written: {problem}; "
                             f"fix its permissions or point {key} elsewhere")
    return ()


FolderCheck = Callable[[str | Path, str], tuple[Path, ...]]


def is_rlflow_export(folder: Path) -> bool:
    return (folder / EXPORT_MARKER).is_file()


def check_export_dir(folder: str | Path, key: str = "trainer.export_hf_dir",
                     writable: FolderCheck = check_writable) -> tuple[Path, ...]:
    """Refuse an export folder rlflow would have to delete although rlflow did not write it; returns the folders
    ``writable`` created for its parent."""
    path = Path(folder)
    if path.is_file():
        raise RunFolderError(f"config key '{key}': {path} is a file; name a folder for the HF export")
    if path.is_dir() and any(path.iterdir()) and not is_rlflow_export(path):
        raise RunFolderError(f"config key '{key}': {path} holds files rlflow did not export (no {EXPORT_MARKER}); "
                             f"the export replaces the folder, so name an empty or new folder")
    return writable(path.parent, key)


def export_dir(trainer_config: Any) -> Path:
    """Where the final HF export goes: ``trainer.export_hf_dir`` or ``<default_local_dir>/hf``."""
    return Path(trainer_config.export_hf_dir or Path(trainer_config.default_local_dir) / "hf")


def _check_outputs(trainer: Any, writable: FolderCheck) -> tuple[Path, ...]:
    """The run folder and the export folders can be written (``writable``: creating them, or only asking); returns
    the folders created."""
    created = writable(Path(trainer.default_local_dir), "trainer.default_local_dir")
    try:
        created += check_export_dir(export_dir(trainer), writable=writable)
        if trainer.export_lora_adapter_dir:
            created += check_export_dir(trainer.export_lora_adapter_dir, "trainer.export_lora_adapter_dir", writable)
    except BaseException:
        remove_empty_folders(created)
        raise
    return created


def _check_resume(config: Any) -> None:
    """The checkpoint ``trainer.resume_mode`` picks loads, with the same math and the same model architecture."""
    checkpoint = CheckpointManager.for_run(config).resolve(config.trainer.resume_mode, config.trainer.resume_from_path)
    if checkpoint is not None:
        check_same_architecture(checkpoint, model_folder(config.model))


def check_run_folder(config: Any) -> None:
    """``open_run_folder``'s checks without creating, writing or locking anything (``--validate``)."""
    _check_outputs(config.trainer, check_creatable)
    check_not_locked(config.trainer.default_local_dir)
    _check_resume(config)


def route_worker_logs(config: Any) -> Any:
    """Have this run's workers write their libraries' log lines under ``<default_local_dir>/logs`` (``RLFLOW_LOG_DIR``,
    which ``init_ray`` passes on; ``rlflow.utils.log_routing``); returns ``config``. For the command-line entry
    points: it sets this process's environment."""
    os.environ.update(worker_log_env(config.trainer.default_local_dir))
    return config


def open_run_folder(config: Any) -> RunLock:
    """The start-up checks of the run folder (see the module doc); returns the held lock.

    Call it in the driver process only, before Ray starts; release the lock when the run ends.
    """
    trainer = config.trainer
    folder = Path(trainer.default_local_dir)
    created = _check_outputs(trainer, check_writable)
    try:
        lock = RunLock(folder, created).acquire()
    except OSError as error:
        remove_empty_folders(created)
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
            raise RunFolderError(f"trainer.default_local_dir {folder}: the file system does not support locks "
                                 f"({os.strerror(error.errno)}); use a local or NFSv4 folder") from None
        raise
    except BaseException:
        remove_empty_folders(created)
        raise
    try:
        _check_resume(config)
    except BaseException:
        lock.release()
        raise
    return lock
