"""The divergence guard in real runs: faults injected through a plugin (tests/faults/divergence_plugin.py).

Each run exits 2 with the guard's one line, at the step where the limit is passed, and the
steps before it are in metrics.jsonl with their counters. Each run starts Ray (1-2 minutes on a
loaded 2-core machine), so only the reward run is in the default tier; the guard's logic is
covered fast by test_divergence.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).resolve().parent / "divergence_plugin.py"


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("divergence")
    files = write_task_files(build_task("addition", digits=2), root / "data", n_train=16, n_val=4, seed=0)
    return {"model": build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0), **files}


def run_entry(module: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m <module> *args`` on a one-worker local Ray, with the fault plugin loaded."""
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    args = [f"trainer.plugins=[{PLUGIN}]", *args, "trainer.device=cpu", "trainer.ray_num_cpus=2",
            f"trainer.ray_temp_dir={ray_dir}", "trainer.val_before_train=false", "trainer.logger=[jsonl]"]
    try:
        return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=timeout)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


def ppo_args(assets: dict[str, Path], run_dir: Path) -> list[str]:
    return [f"model.path={assets['model']}", "model.preset=null", f"data.train_files=[{assets['train']}]",
            "data.val_files=[]", "data.train_batch_size=4", "data.max_response_length=8", "actor.ppo_mini_batch_size=2",
            "rollout=hf", "rollout.n=2", "trainer.total_training_steps=3", f"trainer.default_local_dir={run_dir}"]


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")][-1]


def logged_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(400)
def test_ppo_aborts_when_most_rewards_fail(assets, tmp_path):
    run_dir = tmp_path / "run"
    result = run_entry("rlflow.trainer.main_ppo", [*ppo_args(assets, run_dir),
                                                   f"reward.custom_function={PLUGIN}:broken_reward"])
    assert error_line(result).startswith(
        "error: 8 of 8 samples in this batch (100%) could not be scored by the reward function and got "
        "reward.error_score, more than reward.max_error_fraction=0.5")
    assert logged_steps(run_dir) == [] and not list(run_dir.glob("global_step_*"))  # nothing trained on the bad batch


@pytest.mark.full
@pytest.mark.timeout(400)
def test_ppo_aborts_after_consecutive_skipped_actor_steps(assets, tmp_path):
    run_dir = tmp_path / "run"
    result = run_entry("rlflow.trainer.main_ppo", [*ppo_args(assets, run_dir), "actor.engine.name=nan_grad_fsdp2",
                                                   f"reward.custom_function={PLUGIN}:digit_share",
                                                   "trainer.max_consecutive_skipped_steps=3"])
    assert error_line(result).startswith(
        "error: actor: 3 optimizer steps in a row were skipped because the gradient norm was not finite "
        "(trainer.max_consecutive_skipped_steps=3)")
    steps = logged_steps(run_dir)  # 2 optimizer steps per training step: step 1 logged, step 2 aborts
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["actor/consecutive_skipped_steps"] == 2 and steps[0]["actor/skipped_steps"] == 1.5
    assert steps[0]["reward/error_fraction"] == 0.0


@pytest.mark.full
@pytest.mark.timeout(400)
def test_ppo_aborts_after_consecutive_skipped_critic_steps(assets, tmp_path):
    """GAE with a critic whose gradients are all NaN (its optimizer steps run inside the worker); the actor is sane."""
    run_dir = tmp_path / "run"
    result = run_entry("rlflow.trainer.main_ppo", [*ppo_args(assets, run_dir), "algorithm=ppo", "critic.ppo_mini_batch_size=2",
                                                   "critic.engine.name=nan_grad_fsdp2",
                                                   f"reward.custom_function={PLUGIN}:digit_share",
                                                   "trainer.max_consecutive_skipped_steps=4"])
    assert error_line(result).startswith(
        "error: critic: 4 optimizer steps in a row were skipped because the gradient norm was not finite "
        "(trainer.max_consecutive_skipped_steps=4)")
    steps = logged_steps(run_dir)  # 2 critic optimizer steps per training step: step 1 logged, step 2 aborts
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["critic/consecutive_skipped_steps"] == 2 and steps[0]["critic/skipped"] == 1.0
    assert steps[0]["critic/skipped_steps"] == 1.5 and steps[0]["critic/optim_steps"] == 2
    assert steps[0]["actor/consecutive_skipped_steps"] == 0 and steps[0]["actor/skipped"] == 0.0


@pytest.mark.full
@pytest.mark.timeout(400)
def test_sft_aborts_after_consecutive_skipped_steps(assets, tmp_path):
    run_dir = tmp_path / "run"
    result = run_entry("rlflow.trainer.main_sft", [
        "engine.name=nan_grad_fsdp2", "engine.lr_scheduler.name=constant", f"model.path={assets['model']}",
        "model.preset=null", f"data.train_files=[{assets['sft_train']}]", "data.val_files=[]",
        "data.train_batch_size=8", "trainer.total_training_steps=4", "trainer.max_consecutive_skipped_steps=2",
        f"trainer.default_local_dir={run_dir}"])
    assert error_line(result).startswith("error: train: 2 optimizer steps in a row were skipped")
    steps = logged_steps(run_dir)
    assert [s["step"] for s in steps] == [1] and steps[0]["train/consecutive_skipped_steps"] == 1
