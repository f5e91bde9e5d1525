"""The result file every bench writes with ``--json PATH``, which ``bench/report.py`` turns into
``docs/benchmarks.md``.

A result is one bench's run: the machine line, the date, and rows. A row is one measured ratio
against a baseline taken in the same run (``ratio = value / baseline`` in the row's unit, or the
bench's own definition, stated in ``ratio_meaning``), the target the issue sets, and whether it
was met. ``breakdown`` (optional) is ``{contender: {phase: seconds}}`` for the step-breakdown
figure. ``notes`` are short lines printed under the bench's table (settings used, what won, why a
row was skipped).

Importable as ``results`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from machine import machine_line

SCHEMA_VERSION = 1


@dataclass
class Row:
    """One measured comparison: ``value`` of the contender against ``baseline`` measured in the same run."""

    name: str
    value: float
    baseline_name: str
    baseline: float
    unit: str
    ratio: float
    ratio_meaning: str  # e.g. "baseline / value (speed-up)" - how ``ratio`` was formed
    target: str = ""  # e.g. ">= 0.9"; empty when the issue sets none
    met: Optional[bool] = None  # None when there is no target


@dataclass
class BenchResult:
    """One bench's run, as written to ``--json``."""

    bench: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict)
    machine: str = field(default_factory=machine_line)
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    # the machine's 1/5/15-minute load average when the result was written: other work on the
    # machine slows every contender, so absolute times from a loaded run are not comparable
    load_average: Optional[tuple[float, float, float]] = field(default_factory=os.getloadavg)
    schema: int = SCHEMA_VERSION


def write_result(path: Optional[str], result: BenchResult) -> None:
    """Write ``result`` as JSON to ``path`` (nothing when ``path`` is None: the bench ran without ``--json``)."""
    if path is None:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(asdict(result), indent=2) + "\n")


def read_result(path: str | Path) -> BenchResult:
    """Read a result written by ``write_result``."""
    raw = json.loads(Path(path).read_text())
    if raw.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: bench result schema {raw.get('schema')!r}, expected {SCHEMA_VERSION}; re-run the bench")
    raw["rows"] = [Row(**row) for row in raw["rows"]]
    raw.setdefault("load_average", None)  # results written before the field existed
    return BenchResult(**raw)
