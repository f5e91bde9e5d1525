"""Exact SFT resume at world size 2 (the torchrun launcher's code path, two real gloo ranks).

Run A trains 6 steps without stopping. Run B trains the same job but stops after step 3
(its checkpoint is the one written at the end of that run), then a second invocation with
``resume_mode=auto`` continues it to step 6. Steps 4-6 must repeat A's losses, learning
rates and gradient norms exactly: engine state, LR schedule (cosine, so a schedule restarted
from scratch would show), RNG and data-loader position all come back from the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sft_testlib import SFTAssets, run_ranks, sft_assets, sft_config

from rlflow.trainer.main_sft import run_sft

TOTAL, STOP = 6, 3
KEYS = ("train/loss", "train/lr", "train/grad_norm")


def job(assets: SFTAssets, run_dir: Path, steps: int) -> list[str]:
    return [
        "engine=fsdp2",
        f"model.path={assets.model}",
        f"data.train_files=[{assets.data['sft_train']}]",
        "data.val_files=[]",
        "data.train_batch_size=8",
        "engine.micro_batch_size=2",
        "engine.optimizer.lr=3e-3",
        "engine.lr_scheduler.name=cosine",
        "engine.lr_scheduler.warmup_steps=1",
        f"engine.lr_scheduler.total_steps={TOTAL}",
        f"trainer.total_training_steps={steps}",
        "trainer.launcher=torchrun",
        "trainer.device=cpu",
        "trainer.logger=[jsonl]",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={run_dir}",
    ]


def uninterrupted_then_stopped_and_resumed(rank: int, assets: SFTAssets, out: Path) -> None:
    histories = {
        "uninterrupted": run_sft(sft_config(job(assets, out / "a", TOTAL))),
        "stopped": run_sft(sft_config(job(assets, out / "b", STOP))),
        "resumed": run_sft(sft_config(job(assets, out / "b", TOTAL))),
    }
    if rank == 0:
        (out / "histories.json").write_text(json.dumps(histories))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict[str, dict[int, dict]], Path]:
    out = tmp_path_factory.mktemp("sft_resume")
    run_ranks(uninterrupted_then_stopped_and_resumed, 2, sft_assets(), out)
    histories = json.loads((out / "histories.json").read_text())
    return {name: {entry["step"]: entry for entry in history} for name, history in histories.items()}, out


def test_resumed_steps_repeat_the_uninterrupted_run_exactly(runs):
    by_step, _ = runs
    assert sorted(by_step["stopped"]) == list(range(1, STOP + 1))
    assert sorted(by_step["resumed"]) == list(range(STOP + 1, TOTAL + 1)), "the resumed run must start after step 3"
    for step in range(1, TOTAL + 1):
        run = "stopped" if step <= STOP else "resumed"
        for key in KEYS:
            assert by_step[run][step][key] == by_step["uninterrupted"][step][key], (step, key)
    losses = [by_step["uninterrupted"][s]["train/loss"] for s in range(1, TOTAL + 1)]
    assert losses[-1] < losses[0], "the job must actually train"


def test_checkpoint_folders_and_metrics_log_after_resume(runs):
    _, out = runs
    run_dir = out / "b"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(TOTAL)
    for step in (STOP, TOTAL):
        assert (run_dir / f"global_step_{step}" / "driver_state.pt").is_file()
        assert (run_dir / f"global_step_{step}" / "engine" / "engine_meta.json").is_file()
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, TOTAL + 1)), "every step logged exactly once across the stop and the resume"
    assert (run_dir / "hf" / "config.json").is_file()
