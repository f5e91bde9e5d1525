"""Finding and reading dataset files: parquet and json lines, given as files or folders, local only.

Each file's rows are parsed one by one, so every error names the file and the row index
inside it. A folder stands for the dataset files directly inside it (sorted by name, so the
order is stable).

Parquet is read with HF ``datasets``, after ``pyarrow`` has read its footer (a damaged file is one
line naming it; a file of zero rows is refused as such). JSON lines are read with the standard library:
``datasets``' json builder casts a column whose rows disagree in type to strings (and fails
outright on a column missing from some rows), which would blame the wrong row for a bad
value; the standard library keeps each row exactly as written. Invalid UTF-8 names its byte offset,
a cut-off or invalid JSON list its line and column (``rlflow.utils.text_files``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from rlflow.errors import DataError
from rlflow.utils.registry import Registry
from rlflow.utils.text_files import parse_json, read_text

RowT = TypeVar("RowT")
RowParser = Callable[[dict[str, Any], Path, int], RowT]
# File suffix -> the function that reads its rows.
DATA_FORMAT_REGISTRY: Registry[Callable[[Path], list[dict[str, Any]]]] = Registry("data file format", error=DataError)


@DATA_FORMAT_REGISTRY.register(".parquet")
def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import datasets
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as error:  # noqa: BLE001 - any footer or format error becomes a DataError naming the file
        raise DataError(f"data file {path}: cannot be read as parquet ({type(error).__name__}: {error})") from None
    if rows == 0:
        raise DataError(f"data file {path}: holds no rows (a parquet file with 0 rows); remove it from the data files")
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset("parquet", data_files=str(path), split="train", keep_in_memory=True)
    except Exception as error:  # noqa: BLE001 - any reader failure becomes a DataError naming the file
        raise DataError(f"data file {path}: cannot be read as parquet ({type(error).__name__}: {error})") from None
    return table.to_list()


@DATA_FORMAT_REGISTRY.register(".jsonl", ".json")
def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Rows of a json-lines file (or of a ``.json`` file holding one list of objects, or one object)."""
    text = read_text(path, DataError, "data file")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = parse_json(text, path, DataError, "data file")
    elif path.suffix == ".json" and (single := _one_json_object(text)) is not None:
        rows = [single]
    else:
        rows = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise DataError(f"data file {path}: line {line_number} is not valid JSON ({error})") from None
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"data file {path}, row {index}: expected a JSON object, got {type(row).__name__}")
    return rows


def _one_json_object(text: str) -> dict[str, Any] | None:
    """The object a ``.json`` file holds when it is one JSON object (MATH's one-problem files), else None."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def resolve_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the list of dataset files; a missing path raises ``DataError``."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for entry in paths:
        path = Path(entry).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in DATA_FORMAT_REGISTRY and p.is_file())
            if not found:
                raise DataError(f"data folder {path} holds no {'/'.join(DATA_FORMAT_REGISTRY)} files")
            files.extend(found)
        elif path.is_file():
            if path.suffix not in DATA_FORMAT_REGISTRY:
                raise DataError(f"data file {path}: {DATA_FORMAT_REGISTRY.unknown_message(path.suffix)}")
            files.append(path)
        else:
            raise DataError(f"data file {path} does not exist (check data.train_files / data.val_files)")
    if not files:
        raise DataError("no data files given (data.train_files / data.val_files is empty)")
    return files


def read_rows(path: Path, parse_row: RowParser[RowT]) -> list[RowT]:
    """Every row of one file passed through ``parse_row(row, path, index)`` (which raises ``DataError`` for a bad row)."""
    return [parse_row(row, path, index) for index, row in enumerate(DATA_FORMAT_REGISTRY.get(path.suffix)(path))]


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write ``rows`` to ``path`` as parquet through a temp file and a rename, so a crash never leaves half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
