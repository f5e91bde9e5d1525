"""Trackers: jsonl lines per step (resume-safe), console line and bar, wandb offline run dir, tensorboard events."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from rlflow.config import ConfigError
from rlflow.observability.tracking import JSONL_NAME, Tracking
from rlflow.utils.metric_values import mean_per_key


def step_metrics(step: int) -> dict:
    """A verl-named metrics dict, with tensor and numpy values as a driver would produce them."""
    return {
        "critic/score/mean": torch.tensor(0.25 * step),
        "actor/pg_loss": np.float32(-0.5),
        "actor/entropy": 1.5 + step,
        "actor/ppo_kl": 0.001,
        "response_length/mean": 12,
        "val-core/synthetic/addition/acc/mean@1": 0.75,
        "timing_s/gen": 1.2,
        "timing_s/update_actor": 3.4,
        "perf/throughput": 950.0,
    }


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_has_one_line_per_step_with_every_metric(tmp_path):
    with Tracking("p", "e", ["jsonl"], config={"a": 1}, output_dir=tmp_path) as tracking:
        for step in (1, 2, 3):
            tracking.log(step_metrics(step), step=step)
        tracking.log({"val/loss": 0.5}, step=3)  # more metrics for the same step merge into its line
    records = read_jsonl(tmp_path / JSONL_NAME)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert set(record) >= {"step", *step_metrics(1)}
        assert record["critic/score/mean"] == pytest.approx(0.25 * record["step"])
        assert record["actor/pg_loss"] == -0.5 and record["response_length/mean"] == 12
    assert records[2]["val/loss"] == 0.5 and "val/loss" not in records[1]


def test_jsonl_resume_rewrites_steps_after_the_checkpoint(tmp_path):
    with Tracking("p", "e", ["jsonl"], output_dir=tmp_path) as first:
        for step in (1, 2, 3, 4):
            first.log({"loss": float(step)}, step=step)
    with open(tmp_path / JSONL_NAME, "a") as f:
        f.write('{"step": 5, "loss": 5.')  # the run was killed mid-write
    with Tracking("p", "e", ["jsonl"], output_dir=tmp_path) as resumed:  # resumed from the step-2 checkpoint
        for step in (3, 4, 5):
            resumed.log({"loss": 10.0 * step}, step=step)
    records = read_jsonl(tmp_path / JSONL_NAME)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_console_prints_progress_bar_and_compact_metrics_line(tmp_path, capsys):
    with Tracking("p", "exp", ["console"], output_dir=tmp_path, total_steps=5) as tracking:
        tracking.log(step_metrics(1), step=1)
        tracking.log(step_metrics(2), step=2)
        assert tracking.trackers["console"].bar.n == 2
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert lines[1] == (
        "step 2/5 | reward 0.5 | val-core/synthetic/addition/acc/mean@1 0.75 | pg_loss -0.5 | ppo_kl 0.001 | "
        "entropy 3.5 | resp_len 12 | tok/s 950 | time gen 1.20s update_actor 3.40s"
    )
    assert "exp" in err and "2/5" in err and "<" in err  # tqdm bar: count, then elapsed<remaining (the ETA)


def test_a_long_run_prints_about_thirty_step_lines_and_every_validation_step(tmp_path, capsys):
    with Tracking("p", "exp", ["console", "jsonl"], output_dir=tmp_path, total_steps=200) as tracking:
        for step in range(1, 201):
            tracking.log({"loss": float(step), **({"val/loss": 1.0} if step == 5 else {})}, step=step)
    shown = [int(line.split()[1].split("/")[0]) for line in capsys.readouterr().out.strip().splitlines()]
    assert shown == sorted({1, 5, 200, *range(7, 201, 7)})  # every 7th of 200, the first, the last, the validation
    assert len(read_jsonl(tmp_path / JSONL_NAME)) == 200  # the files keep every step


def test_wandb_offline_writes_a_run_directory(tmp_path):
    assert os.environ.get("WANDB_MODE") == "offline"  # set by tests/conftest.py; nothing leaves the machine
    with Tracking("rlflow-test", "exp", ["wandb"], config={"data": {"seed": 3}}, output_dir=tmp_path) as tracking:
        for step in (1, 2):
            tracking.log(step_metrics(step), step=step)
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    run_dirs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(run_dirs) == 1
    history_file = run_dirs[0] / f"run-{run_id}.wandb"
    deadline = time.monotonic() + 30  # wandb-core may still be flushing the file after finish() returns
    while b"critic/score/mean" not in history_file.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    history = history_file.read_bytes()
    assert b"actor/pg_loss" in history and b"critic/score/mean" in history


def test_tensorboard_writes_event_files_with_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracking("p", "e", ["tensorboard"], output_dir=tmp_path) as tracking:
        for step in (1, 2, 3):
            tracking.log(step_metrics(step), step=step)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    score = events.Scalars("critic/score/mean")
    assert [(e.step, e.value) for e in score] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "timing_s/update_actor" in events.Tags()["scalars"]


def test_unknown_backend_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown tracker 'mlflow' \(config key trainer.logger\); registered: console"):
        Tracking("p", "e", ["console", "mlflow"], output_dir=tmp_path)


def test_reduce_metrics_means_each_key_over_the_dicts_that_have_it():
    reduced = mean_per_key([{"a": 1.0, "b": torch.tensor(2.0)}, {"a": 3.0}, {"a": np.float64(5.0), "c": 1}])
    assert reduced == {"a": 3.0, "b": 2.0, "c": 1.0}
    assert mean_per_key([]) == {}
