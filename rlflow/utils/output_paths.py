"""An output folder named on a command line, checked before any work: a folder (or a new one), writable.

The side tools (``rlflow-data``, ``rlflow-export``, ``rlflow-eval``, the service's checkpoint folder)
check their outputs with ``check_output_folder`` / ``check_output_file`` before they read, convert,
generate or start anything, so a typo costs no work and leaves nothing behind: nothing is created
here (the nearest existing ancestor of a new folder must be a writable folder). ``folder_write_problem``
asks the same without raising (``--validate``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from rlflow.errors import UserError


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself if it exists, else the closest folder above it that does."""
    absolute = Path(path).absolute()
    return next(candidate for candidate in (absolute, *absolute.parents) if candidate.exists())


def folder_write_problem(path: str | Path) -> Optional[str]:
    """Why ``path`` could not be used as a writable folder (created first where missing), or None.

    Nothing is created: a missing folder is judged by the closest existing folder above it, which
    must be a folder this process may create entries in.
    """
    existing = nearest_existing(path)
    if not existing.is_dir():
        return f"{existing} is a file, so the path cannot be created"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == Path(path).absolute() else f"{existing}, the closest existing folder above it,"
        return f"{where} is not writable (permission denied)"
    return None


def _check_writable_folder(folder: Path, path: Path, label: str, error: type[UserError]) -> None:
    """``folder`` (where ``path`` goes) exists as a writable folder, or its nearest existing ancestor is one."""
    problem = folder_write_problem(folder)
    if problem is not None:
        raise error(f"{label} {path}: {problem}; fix it or name another")


def check_output_folder(path: str | Path, label: str, error: type[UserError] = UserError) -> Path:
    """``path`` if it is a folder (or can be created as one) that this process can write in, else ``error`` naming
    ``label`` (the flag or config key) and the reason."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise error(f"{label} {folder} is a file; name a folder")
    _check_writable_folder(folder, folder, label, error)
    return folder


def check_output_file(path: str | Path, label: str, error: type[UserError] = UserError) -> Path:
    """``path`` if a file can be written there (not a folder; its folder exists or can be created, writable)."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise error(f"{label} {file} is a folder; name a file")
    _check_writable_folder(file.parent, file, label, error)
    return file
