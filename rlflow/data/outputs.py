"""What ``rlflow-data`` may write into its ``--out`` folder: never a file it did not write.

Each run records the files it wrote in the folder's marker (``.rlflow-data-outputs``). Before any
work, ``check_outputs`` refuses a ``--out`` that is a file or not writable, a target file the marker
does not list (a user's file, left byte for byte as it is), and one it lists unless ``overwrite``
(``--overwrite``: replace rlflow-data's own earlier output). ``record_outputs`` adds the written files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from rlflow.errors import DataError
from rlflow.utils.output_paths import check_output_folder
from rlflow.utils.text_files import read_json

OUTPUTS_MARKER = ".rlflow-data-outputs"  # JSON; no .json suffix, so a folder of data files never reads it as one


def written_before(out_dir: Path) -> set[str]:
    """The file names an earlier rlflow-data run recorded in ``out_dir`` (none without a marker)."""
    marker = out_dir / OUTPUTS_MARKER
    if not marker.is_file():
        return set()
    record = read_json(marker, DataError, "rlflow-data marker")
    return set(record.get("files", [])) if isinstance(record, dict) else set()


def check_outputs(out_dir: str | Path, names: Iterable[str], overwrite: bool) -> Path:
    """``out_dir`` if writing ``names`` into it replaces no file rlflow-data did not write (and its own only with
    ``overwrite``); else one ``DataError`` line naming the file."""
    folder = check_output_folder(out_dir, "--out", DataError)
    ours = written_before(folder) if folder.is_dir() else set()
    for name in names:
        target = folder / name
        if not target.exists():
            continue
        if name not in ours:
            raise DataError(f"--out {folder}: {target} exists and rlflow-data did not write it (not in {OUTPUTS_MARKER}); "
                            "it is left as it is: name another --out, or move the file")
        if not overwrite:
            raise DataError(f"--out {folder}: {target} was written by an earlier rlflow-data run; pass --overwrite to "
                            "replace it, or name another --out")
    return folder


def record_outputs(out_dir: Path, names: Iterable[str]) -> None:
    """Add ``names`` to the marker of ``out_dir`` (after they were written)."""
    files = sorted(written_before(out_dir) | set(names))
    (out_dir / OUTPUTS_MARKER).write_text(json.dumps({"files": files}, indent=1) + "\n")
