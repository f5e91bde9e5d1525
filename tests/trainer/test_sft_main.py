"""``python -m rlflow.trainer.main_sft`` end to end: Ray worker group, falling loss, export, and a warm start.

The run is the SFT phase of the reduced demo (the ``demo`` fixture of ``conftest.py``):
``recipes/sft_tiny_cpu.sh``, which is ``main_sft engine=fsdp2`` on the tiny preset and the synthetic
chain-arithmetic task's worked solutions, in a Ray worker group. It must log a falling train and
validation loss and a console line per step, write its checkpoints and HF export, and the exported
model's greedy accuracy on the task's held-out val prompts (scored by the reward registry, measured
by the evaluator's command-line entry, run in this process) must rise from ~0 (the untrained preset)
to at least ``ACCURACY_FLOOR``. docs/sft.md has the numbers.
"""

from __future__ import annotations

import re

import pytest

from rlflow.observability import evaluate
from rlflow.observability.evaluate import evaluate_greedy_accuracy

ACCURACY_FLOOR = 0.2
UNTRAINED_CEILING = 0.05
MAX_NEW_TOKENS = 32  # the longest worked solution of the demo task is 28 tokens with EOS
VAL_FREQ = 100  # recipes/sft_tiny_cpu.sh: validation and a checkpoint every 100 steps
pytestmark = pytest.mark.timeout(1800)  # run alone, the test builds the demo fixture first (5-7 min)


def test_main_sft_trains_on_ray_and_the_warm_start_beats_the_untrained_model(demo, capsys):
    run_dir, steps = demo.out / "sft", demo.sft_steps
    records = demo.metrics("sft")
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    val = {r["step"]: r["val/loss"] for r in records if "val/loss" in r}
    assert len(losses) == steps
    assert sum(losses[-20:]) / 20 < 0.25 * losses[0], f"train loss {losses[0]:.3f} -> {losses[-20:]}"
    assert sorted(val) == list(range(0, steps + 1, VAL_FREQ))
    assert val[steps] < val[VAL_FREQ] < val[0]
    assert f"step {steps}/{steps}" in demo.log, "the console tracker prints the last step's line"
    assert (run_dir / f"global_step_{steps}" / "driver_state.pt").is_file()

    val_prompts = demo.out / "data" / "val.parquet"
    untrained = evaluate_greedy_accuracy(demo.out / "model", val_prompts, max_new_tokens=MAX_NEW_TOKENS, backend="hf")
    status = evaluate.main(["--model", str(run_dir / "hf"), "--data", str(val_prompts),
                            "--max-new-tokens", str(MAX_NEW_TOKENS), "--backend", "hf"])
    printed = capsys.readouterr().out
    assert status == 0
    warm = float(re.search(r"^accuracy ([0-9.]+) \((\d+) prompts", printed, re.M).group(1))
    with capsys.disabled():
        print(f"\ngreedy accuracy on {untrained['num_samples']} val prompts: untrained {untrained['accuracy']:.3f}, "
              f"after {steps} SFT steps {warm:.3f}")
    assert untrained["accuracy"] <= UNTRAINED_CEILING
    assert warm >= ACCURACY_FLOOR
