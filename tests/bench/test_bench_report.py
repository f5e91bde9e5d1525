"""bench/report.py: the generated benchmarks page from synthetic result files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the benches import each other by file name

from report import build_report  # noqa: E402
from results import BenchResult, Row, write_result  # noqa: E402


def _result(bench: str, breakdown: dict[str, dict[str, float]]) -> BenchResult:
    row = Row(name="fsdp2 step", value=95.0, baseline_name="plain", baseline=100.0, unit="tokens/s",
              ratio=0.95, ratio_meaning="value / baseline", target=">= 0.9", met=True)
    missed = Row(name="dispatch 100 MB", value=0.3, baseline_name="put/get", baseline=0.2, unit="s",
                 ratio=1.5, ratio_meaning="value / baseline", target="<= 1.2", met=False)
    return BenchResult(bench=bench, title=f"Title of {bench}", rows=[row, missed], notes=["settings: tiny"],
                       breakdown=breakdown, machine="Test CPU; 2 cores", date="2026-01-01 00:00 UTC",
                       load_average=(9.5, 4.25, 1.0))


@pytest.fixture
def bench_dirs(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results"
    write_result(str(results / "engine_throughput.json"), _result("engine_throughput", {}))
    write_result(str(results / "grpo_vs_trl.json"),
                 _result("grpo_vs_trl", {"rlflow": {"generate": 1.0, "update": 2.0}, "trl": {"generate": 2.0, "update": 3.0}}))
    return results, tmp_path / "docs" / "benchmarks.md"


def test_tables_not_run_png_and_findings(bench_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    results, out = bench_dirs
    findings = tmp_path / "findings.md"
    findings.write_text("The top cost is the backward of the LM head.\n")
    markdown = build_report(results, out, findings, ["engine_throughput", "scaling", "grpo_vs_trl"])
    assert out.read_text() == markdown
    assert "Do not edit by hand" in markdown and "make bench" in markdown
    assert "## Title of engine_throughput (`bench/engine_throughput.py`)" in markdown
    assert "Machine: Test CPU; 2 cores" in markdown and "Date: 2026-01-01 00:00 UTC" in markdown
    assert "| fsdp2 step | 95 tokens/s | plain: 100 tokens/s | 0.950 (value / baseline) | >= 0.9 | yes |" in markdown
    assert "| dispatch 100 MB | 0.3 s | put/get: 0.2 s | 1.500 (value / baseline) | <= 1.2 | **no** |" in markdown
    assert "- settings: tiny" in markdown
    assert "Load average (1/5/15 min) at the end: 9.5 / 4.2 / 1.0" in markdown
    assert "## `bench/scaling.py`\n\nnot run" in markdown
    assert "## Profile findings\n\nThe top cost is the backward of the LM head." in markdown
    # expected benches first in the order given
    assert markdown.index("engine_throughput.py`)") < markdown.index("scaling.py`") < markdown.index("grpo_vs_trl.py`)")
    png = out.with_name("benchmarks_step.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![step breakdown per contender](benchmarks_step.png)" in markdown


def test_no_breakdown_no_findings(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_result(str(results / "engine_throughput.json"), _result("engine_throughput", {}))
    out = tmp_path / "benchmarks.md"
    markdown = build_report(results, out, tmp_path / "absent.md", [])
    assert not out.with_name("benchmarks_step.png").exists()
    assert "Step breakdown" not in markdown and "Profile findings" not in markdown
    assert "not run" not in markdown


def test_result_without_load_average_reads_as_not_recorded(tmp_path: Path) -> None:
    import json

    path = tmp_path / "results" / "engine_throughput.json"
    write_result(str(path), _result("engine_throughput", {}))
    raw = json.loads(path.read_text())
    del raw["load_average"]  # a result written before the field existed
    path.write_text(json.dumps(raw))
    markdown = build_report(path.parent, tmp_path / "benchmarks.md", tmp_path / "absent.md", [])
    assert "Load average (1/5/15 min) at the end: not recorded" in markdown
