"""``python -m rlflow.trainer.main_sft`` end to end: Ray worker group, falling loss, export, and a warm start.

The tiny preset is fine-tuned on 2-digit addition with worked solutions through the real
command line (default launcher: a Ray worker group running the fsdp2 engine). The run must
log a falling train and validation loss, write its checkpoint and HF export, and the exported
model's greedy accuracy on the task's held-out val prompts (scored by the reward registry)
must rise from ~0 (the untrained preset) to at least ``ACCURACY_FLOOR`` (measured by the
evaluator's command-line entry, run in this process).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile

import pytest
from sft_testlib import run_main_sft, sft_assets

from rlflow.observability import evaluate
from rlflow.observability.evaluate import evaluate_greedy_accuracy

STEPS = 650
ACCURACY_FLOOR = 0.2
UNTRAINED_CEILING = 0.05
MAX_NEW_TOKENS = 16  # "ab+cd=xyz\n#### xyz" plus end-of-turn fits


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_main_sft_trains_on_ray_and_the_warm_start_beats_the_untrained_model(tmp_path, capsys):
    assets = sft_assets()
    run_dir = tmp_path / "run"
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    try:
        result = run_main_sft([
            "engine=fsdp2",
            "model=tiny",
            f"model.path={assets.model}",
            "data=synthetic",
            f"data.train_files=[{assets.full_data['sft_train']}]",
            f"data.val_files=[{assets.full_data['sft_val']}]",
            f"trainer.total_training_steps={STEPS}",
            "engine.micro_batch_size=32",  # one (packed) micro-batch per step: fewer, larger kernels on CPU
            f"trainer.test_freq={STEPS // 2}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.device=cpu",
            "trainer.logger=[console,jsonl]",
            "trainer.ray_num_cpus=2",
            f"trainer.ray_temp_dir={ray_dir}",
        ], timeout=580)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    val = {r["step"]: r["val/loss"] for r in records if "val/loss" in r}
    assert len(losses) == STEPS
    assert sum(losses[-20:]) / 20 < 0.25 * losses[0], f"train loss {losses[0]:.3f} -> {losses[-20:]}"
    assert sorted(val) == [0, STEPS // 2, STEPS]
    assert val[STEPS] < val[STEPS // 2] < val[0]
    assert f"step {STEPS}/{STEPS}" in result.stdout, "the console tracker prints a line per step"
    assert (run_dir / f"global_step_{STEPS}" / "driver_state.pt").is_file()

    untrained = evaluate_greedy_accuracy(assets.model, assets.full_data["val"], max_new_tokens=MAX_NEW_TOKENS)
    status = evaluate.main(["--model", str(run_dir / "hf"), "--data", str(assets.full_data["val"]),
                            "--max-new-tokens", str(MAX_NEW_TOKENS)])
    printed = capsys.readouterr().out
    assert status == 0
    warm = float(re.search(r"^accuracy ([0-9.]+) \((\d+) prompts", printed, re.M).group(1))
    with capsys.disabled():
        print(f"\ngreedy accuracy on {untrained['num_samples']} val prompts: untrained {untrained['accuracy']:.3f}, "
              f"after {STEPS} SFT steps {warm:.3f}")
    assert untrained["accuracy"] <= UNTRAINED_CEILING
    assert warm >= ACCURACY_FLOOR
