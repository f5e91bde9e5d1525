"""Acceptance: GSM8K-format files -> ``rlflow-data gsm8k`` -> GRPO through ``main_ppo`` (real Ray, FSDP2).

The word problems are generated here in GSM8K's layout (``question``; ``answer`` with the
worked steps and ``#### n``). The run scores with the built-in ``openai/gsm8k`` rule reward and
validates on the converted test split, so its metrics carry verl's validation name.
"""

from __future__ import annotations

import json

import pytest

from conftest import base_overrides, read_jsonl, run_main_ppo
from rlflow.data.cli import main

VAL_METRIC = "val-core/openai/gsm8k/reward/mean@1"
# Keys of base_overrides this run replaces: its own data, and the built-in rule reward instead of the test one.
REPLACED = ("data.train_files", "data.val_files", "reward.custom_function")


def gsm8k_rows(count: int, offset: int) -> list[dict]:
    rows = []
    for i in range(offset, offset + count):
        a, b = i % 9 + 1, (3 * i) % 7 + 2
        rows.append({"question": f"Ann has {a} pens and gets {b} more. How many pens does she have?",
                     "answer": f"She has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} pens.\n#### {a + b}"})
    return rows


@pytest.mark.full  # make test: rlflow-data's gsm8k conversion and verl's val metric names have unit tests
@pytest.mark.timeout(600)
def test_gsm8k_parquet_from_rlflow_data_trains_two_grpo_steps_with_verl_val_metric(tiny_model, tmp_path):
    src = tmp_path / "gsm8k"
    src.mkdir()
    for split, rows in (("train", gsm8k_rows(8, 0)), ("test", gsm8k_rows(4, 8))):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = tmp_path / "data"
    assert main(["gsm8k", "--src", str(src), "--out", str(data)]) == 0

    run_dir = tmp_path / "run"
    overrides = [o for o in base_overrides(tiny_model, data, run_dir) if not o.startswith(REPLACED)] + [
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]",
        "data.max_prompt_length=128",  # English text is ~1 token per 1.5 characters for the tiny tokenizer
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",  # validate once, after the last step
        "rollout=hf",  # HF generate: no vLLM engine to start, the cheapest GRPO run here
    ]
    result = run_main_ppo(overrides)
    assert result.returncode == 0, result.stderr[-3000:]

    records = {record["step"]: record for record in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(records) == [1, 2]
    assert all("reward/source/openai/gsm8k/mean" in record for record in records.values()), "not the gsm8k reward"
    assert 0.0 <= records[2][VAL_METRIC] <= 1.0
