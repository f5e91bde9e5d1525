"""Whether a folder could be created and written, asked without creating or writing anything (``--validate``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


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
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == Path(path).absolute() else f"{existing}, the closest existing folder above it,"
        return f"{where} is not writable (permission denied)"
    return None
