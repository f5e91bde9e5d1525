"""A checkpoint's manifest: every file it holds with its size, so a missing or cut-short file is found cheaply.

``manifest.json`` is written last into ``global_step_N.partial`` (before the rename). On
resume the driver checks it before any worker starts: each listed file must exist with its
recorded size. That finds a deleted engine shard, a truncated driver state or a half-copied
folder without loading a weight; a file whose bytes changed but whose size did not is found
only when it is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

MANIFEST_FILE = "manifest.json"


def write_manifest(folder: Path, step: int) -> None:
    """List every file under ``folder`` (relative path -> size) in ``folder/manifest.json``."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = Path(parent) / name
            files[str(path.relative_to(folder))] = path.stat().st_size
    (folder / MANIFEST_FILE).write_text(json.dumps({"step": step, "files": files}, indent=1, sort_keys=True) + "\n")


def manifest_problem(folder: Path) -> Optional[str]:
    """Why ``folder`` does not match its manifest (a missing or resized file), or None; None without a manifest."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        return f"{MANIFEST_FILE} is unreadable ({error})"
    for name, size in sorted(files.items()):
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were written"
    return None
