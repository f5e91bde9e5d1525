"""The end-of-run report on hand-written metrics files: token rates, the summary table, the
curves PNG, the samples table and the one-line errors. The demo tests run it on real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlflow.errors import UserError
from rlflow.observability.report import (
    RL_RATES,
    build_report,
    named_paths,
    read_metrics,
    read_phase_times,
    samples_markdown,
    token_rate,
    val_core_series,
)


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def rl_records(steps: int = 4) -> list[dict]:
    records = [{"step": 0, "val-core/synthetic/addition/reward/mean@1": 0.25}]
    for step in range(1, steps + 1):
        records.append({"step": step, "critic/score/mean": 0.1 * step, "response_length/mean": 20.0 + step,
                        "actor/ref_kl": 0.01 * step, "actor/ppo_kl": 0.0, "rollout/generated_tokens": 1000.0 * step,
                        "timing_s/gen": 2.0, "perf/total_num_tokens": 3000.0, "timing_s/update_actor": 1.5})
    records.append({"step": steps, "val-core/synthetic/addition/reward/mean@1": 0.5})
    return records


def test_token_rates_are_total_tokens_over_total_seconds():
    records = rl_records(4)
    rollout, train = (token_rate(records, rate) for rate in RL_RATES)
    assert rollout == pytest.approx((1000 + 2000 + 3000 + 4000) / (4 * 2.0))
    assert train == pytest.approx(4 * 3000 / (4 * 1.5))
    assert token_rate([{"step": 1}], RL_RATES[0]) is None


def test_val_curve_is_the_core_mean_over_data_sources():
    records = [{"step": 0, "val-core/a/reward/mean@1": 0.2, "val-core/b/acc/mean@1": 0.6, "val-aux/a/reward/std@1": 9.0},
               {"step": 2, "val-core/a/reward/mean@4": 0.5, "val-core/a/reward/best@4/mean": 0.9,
                "val-core/a/reward/maj@4/mean": 0.7},
               {"step": 3, "critic/score/mean": 0.1}]
    steps, values = val_core_series(records)
    assert steps == [0, 2] and values == pytest.approx([0.4, 0.5])


def test_report_writes_curves_and_a_summary_of_every_phase(tmp_path):
    grpo = write_run(tmp_path / "grpo", rl_records(4))
    sft = write_run(tmp_path / "sft", [{"step": s, "train/loss": 1.0 / s, "perf/throughput": 500.0, "timing_s/step": 0.5}
                                       for s in range(1, 11)])
    times = tmp_path / "times.tsv"
    times.write_text("preset\t3\nsft\t40\ngrpo\t200\n")
    summary = build_report(tmp_path / "report", {"sft": sft, "grpo": grpo}, {}, [], read_phase_times(times))

    import matplotlib.image

    image = matplotlib.image.imread(summary["files"]["curves"])
    assert image.ndim == 3 and image[..., :3].std() > 0.05
    phases = {phase["name"]: phase for phase in summary["phases"]}
    assert list(phases) == ["preset", "sft", "grpo"]
    assert phases["sft"]["steps"] == 10 and phases["sft"]["tokens_per_s"] == {"train": pytest.approx(500.0)}
    assert phases["grpo"]["steps"] == 4 and set(phases["grpo"]["tokens_per_s"]) == {"rollout", "train"}
    assert phases["preset"]["wall_s"] == 3 and phases["preset"]["steps"] is None
    assert "| sft | 10 | 40 s | train 500 |" in summary["table"]
    assert "| grpo | 4 | 3.3 min | rollout 1,250, train 2,000 |" in summary["table"]
    assert "| total | | 4.0 min | |" in summary["table"]
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["table"] == summary["table"]


def test_samples_table_has_one_column_per_model():
    example = {"prompt": "What is 1+2?", "ground_truth": "3"}
    results = {"before": {"examples": [{**example, "response": "#|\x1e#\x08 4", "score": 0.0}]},
               "after": {"examples": [{**example, "response": "1+2=3\n#### 3", "score": 1.0}]}}
    table = samples_markdown(results)
    assert "| prompt | truth | before | after |" in table
    assert "| What is 1+2? | 3 | ✗ `#\\|<br>#\ufffd 4` | ✓ `1+2=3<br>#### 3` |" in table.splitlines()


def test_bad_inputs_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match="no metrics file"):
        read_metrics(tmp_path)
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(UserError, match="line 2: not JSON"):
        read_metrics(bad)
    bad.write_text('{"loss": 1}\n')
    with pytest.raises(UserError, match="line 1: a record needs an integer 'step'"):
        read_metrics(bad)
    with pytest.raises(UserError, match="expected NAME=PATH"):
        named_paths(["just_a_path"], "--run")
    times = tmp_path / "times.tsv"
    times.write_text("sft\tforty\n")
    with pytest.raises(UserError, match="line 1: expected 'name<TAB>seconds'"):
        read_phase_times(times)
    with pytest.raises(UserError, match="not an HF model folder"):
        build_report(tmp_path / "out", {}, {"sft": tmp_path / "missing"}, [tmp_path / "val.parquet"], {})
