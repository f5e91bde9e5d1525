"""Shared set-up for driver tests: one tiny preset and one synthetic task folder per session,
and a runner for ``python -m rlflow.trainer.main_ppo`` in a subprocess (the way users run it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.trainer.entry_points import compose_ppo_config

REPO = Path(__file__).resolve().parents[2]
DIGIT_REWARD = Path(__file__).resolve().parent / "digit_reward.py"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_preset(tmp_path_factory.mktemp("model") / "tiny", tokenizer_corpus(), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def addition_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "addition"
    write_task_files(build_task("addition", digits=2), out, n_train=64, n_val=16, seed=0)
    return out


def base_overrides(model: Path, data: Path, run_dir: Path) -> list[str]:
    """A small, fast, deterministic GRPO run on one worker process, with a dense test reward."""
    return [
        f"model.path={model}",
        "model.preset=null",
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'val.parquet'}]",
        "data.train_batch_size=4",
        "data.max_response_length=12",
        "actor.ppo_mini_batch_size=2",
        "rollout.n=2",
        "trainer.ray_num_cpus=2",
        "trainer.val_before_train=false",
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"reward.custom_function={DIGIT_REWARD}:digit_share",
    ]


def run_main_ppo(overrides: list[str], timeout: float = 600, env: dict[str, str] | None = None,
                 **popen_kwargs) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen_kwargs)


# Wall-clock and machine-load figures differ between any two runs; everything else is reproducible.
VARYING_PREFIXES = ("timing_s/", "perf/")
VARYING_WORDS = ("memory", "_mb", "idle_fraction")  # idle fractions are ratios of wall-clock times


def comparable(record: dict) -> dict:
    """A metrics record without its wall-clock timings, throughput and memory figures."""
    return {
        key: value
        for key, value in record.items()
        if not key.startswith(VARYING_PREFIXES) and not any(word in key for word in VARYING_WORDS)
    }


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compose_ppo(overrides: list[str]):
    """The validated config ``main_ppo`` would build from ``overrides`` (in-process, no subprocess)."""
    return compose_ppo_config(overrides)
