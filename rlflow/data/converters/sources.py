"""Running a converter over local source files: find them, tell their splits, write ``OUT/<split>.parquet``.

A source is a file or a folder (every ``.parquet``/``.jsonl``/``.json`` file below it, in path
order). A file's split is the first of ``SPLIT_WORDS`` among the words of its name (and, inside a
source folder, of the folders between it and the source): ``train-00000-of-00001.parquet`` and
``MATH/test/algebra/1.json`` both say which split they are. ``--split`` overrides that.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from rlflow.data.converters.base import DatasetConverter
from rlflow.data.files import DATA_FORMAT_REGISTRY, read_rows, write_parquet
from rlflow.data.outputs import check_outputs, record_outputs
from rlflow.errors import DataError

SPLIT_WORDS = ("train", "test", "validation", "val")


def _words(parts: tuple[str, ...]) -> list[str]:
    return [word for part in parts for word in re.split(r"[^a-z]+", part.lower()) if word]


def _files_of(source: Path) -> list[tuple[Path, list[str]]]:
    """The dataset files of one source, each with the words that may name its split."""
    if source.is_file():
        if source.suffix not in DATA_FORMAT_REGISTRY:
            raise DataError(f"--src {source}: {DATA_FORMAT_REGISTRY.unknown_message(source.suffix)}")
        return [(source, _words((source.stem,)))]
    if not source.is_dir():
        raise DataError(f"--src {source} does not exist; pass a local copy of the dataset files (a file or a folder)")
    found = sorted(p for p in source.rglob("*") if p.suffix in DATA_FORMAT_REGISTRY and p.is_file())
    if not found:
        raise DataError(f"--src {source} holds no {'/'.join(DATA_FORMAT_REGISTRY)} files")
    return [(path, _words(path.relative_to(source).with_suffix("").parts)) for path in found]


def split_files(sources: list[Path], split: Optional[str] = None) -> dict[str, list[Path]]:
    """The source files grouped by split (``split`` for all of them when given)."""
    groups: dict[str, list[Path]] = {}
    for source in sources:
        for path, words in _files_of(source):
            name = split or next((word for word in words if word in SPLIT_WORDS), None)
            if name is None:
                raise DataError(f"cannot tell the split of {path} from its name (none of {', '.join(SPLIT_WORDS)} "
                                "in it); rename it or pass --split NAME")
            groups.setdefault(name, []).append(path)
    return groups


def convert_sources(converter: DatasetConverter, sources: list[Path], out_dir: Path,
                    split: Optional[str] = None, overwrite: bool = False) -> dict[str, tuple[Path, int]]:
    """Convert every source file into ``out_dir/<split>.parquet``; returns each split's file and row count.

    Every row is converted before anything is written, so a bad row leaves ``out_dir`` untouched; a
    file of those names is replaced only if rlflow-data wrote it and ``overwrite`` is set, checked
    before any row is read (``outputs``).
    """
    groups = split_files(sources, split)
    names = [f"{name}.parquet" for name in groups]
    sources_read = {path.resolve() for paths in groups.values() for path in paths}
    for name in names:
        if (out_dir / name).resolve() in sources_read:
            raise DataError(f"--out {out_dir} would overwrite the source file {(out_dir / name).resolve()}; pick another --out")
    check_outputs(out_dir, names, overwrite)
    tables: dict[str, list[dict]] = {}
    for name, paths in groups.items():
        converted = [row for path in paths for row in read_rows(path, converter.convert)]
        tables[name] = [converter.rl_row(row, name, index) for index, row in enumerate(converted)]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {name: (write_parquet(rows, out_dir / f"{name}.parquet"), len(rows)) for name, rows in tables.items()}
    record_outputs(out_dir, names)
    return written
