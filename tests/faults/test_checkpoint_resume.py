"""Real PPO runs: SIGTERM checkpoints and exits cleanly, and a corrupt newest checkpoint is skipped on resume.

One ``main_ppo`` run of 5 steps (checkpoints every 2) gets SIGTERM once step 3 is logged: it
checkpoints the step it is in, exits 0 without the final export. Its newest checkpoint is then
cut short, and the same command resumes from the previous one (with a warning naming the
skipped one) to the end: every step is in the jsonl exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.trainer.checkpoint import DRIVER_STATE

REPO = Path(__file__).resolve().parents[2]
DIGIT_REWARD = REPO / "tests" / "ppo" / "digit_reward.py"
TOTAL = 5


def overrides(model: Path, data: Path, run_dir: Path) -> list[str]:
    return [
        f"model.path={model}", "model.preset=null",
        f"data.train_files=[{data / 'train.parquet'}]",
        "data.val_files=[]", "data.train_batch_size=4", "data.max_response_length=8",
        "actor.ppo_mini_batch_size=2", "rollout.n=2",
        "trainer.ray_num_cpus=2", "trainer.val_before_train=false", "trainer.logger=[console,jsonl]",
        f"trainer.total_training_steps={TOTAL}", "trainer.save_freq=2",
        f"trainer.default_local_dir={run_dir}",
        f"reward.custom_function={DIGIT_REWARD}:digit_share",
    ]


def logged_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def main_ppo(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            **kwargs)


@pytest.mark.full
@pytest.mark.timeout(1200)
def test_sigterm_checkpoints_and_exits_then_resume_skips_a_corrupt_newest_checkpoint(tmp_path):
    model = build_preset(tmp_path / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
    data = tmp_path / "addition"
    write_task_files(build_task("addition", digits=2), data, n_train=64, n_val=8, seed=0)
    run_dir = tmp_path / "run"
    args = overrides(model, data, run_dir)

    proc = main_ppo(args)
    deadline = time.monotonic() + 900
    while 3 not in logged_steps(run_dir / "metrics.jsonl"):
        assert proc.poll() is None, f"main_ppo ended early:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "step 3 was never logged"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # the driver only, as a scheduler's preemption notice
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    preempted = [line for line in output.splitlines() if "preempted after step" in line]
    assert preempted, output[-3000:]
    stopped = int(preempted[0].split("preempted after step ")[1].split(":")[0])
    assert 3 <= stopped < TOTAL
    assert (run_dir / f"global_step_{stopped}" / DRIVER_STATE).is_file(), "SIGTERM saved no checkpoint"
    assert logged_steps(run_dir / "metrics.jsonl") == list(range(1, stopped + 1)), "the checkpointed step was not logged"
    assert not (run_dir / "hf").exists(), "a preempted run must not export"

    newest = run_dir / f"global_step_{stopped}" / DRIVER_STATE
    newest.write_bytes(newest.read_bytes()[:100])  # the newest checkpoint is cut short
    resumed = main_ppo(args)
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output[-3000:]
    assert f"global_step_{stopped} cannot be loaded" in output and "falling back to the previous one" in output
    assert "resumed from" in output and "global_step_2" in output
    assert logged_steps(run_dir / "metrics.jsonl") == list(range(1, TOTAL + 1)), "every step exactly once"
    assert (run_dir / "hf" / "model.safetensors").is_file()
