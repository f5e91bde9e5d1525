"""Exact SFT resume at world size 2 (the torchrun launcher's code path, two real gloo ranks).

Run A trains 6 steps without stopping. Run B trains the same job but stops after step 3
(its checkpoint is the one written at the end of that run), then a second invocation with
``resume_mode=auto`` continues it to step 6. Steps 4-6 must repeat A's losses, learning
rates, gradient norms and final validation loss exactly: engine state, LR schedule (cosine, so
a schedule restarted from scratch would show), RNG and data-loader position all come back from
the checkpoint. The validation loss over two ranks (batches padded with loss-free rows) is also
checked against a plain forward pass.

Run C is a copy of B's step-3 checkpoint resumed on ONE rank (DCP reshards the fsdp2 state; the
driver owns the data order, so the global batches do not depend on the world size): steps 4-6
repeat A's losses within fp32 tolerance (``RESHARD_LOSS_TOL``) and its learning rates exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from sft_testlib import SFTAssets, run_ranks, sft_assets, sft_config
from transformers import AutoModelForCausalLM

from rlflow.data.sft_dataset import SFTDataset
from rlflow.models.loading import load_tokenizer
from rlflow.trainer.main_sft import run_sft

TOTAL, STOP = 6, 3
KEYS = ("train/loss", "train/lr", "train/grad_norm")
# 1 rank vs 2 ranks: the same math in another summation order (fp32 round-off, ~1e-7 measured)
RESHARD_LOSS_TOL = 1e-5


def job(assets: SFTAssets, run_dir: Path, steps: int) -> list[str]:
    return [
        "engine=fsdp2",
        f"model.path={assets.model}",
        f"data.train_files=[{assets.data['sft_train']}]",
        f"data.val_files=[{assets.data['sft_val']}]",
        "data.val_batch_size=5",  # odd batches: each is padded for the 2 ranks with loss-free rows
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
    }
    if rank == 0:  # run C starts from a copy of B's step-3 checkpoint, on one rank
        shutil.copytree(out / "b", out / "c")
    dist.barrier()
    histories["resumed"] = run_sft(sft_config(job(assets, out / "b", TOTAL)))
    if rank == 0:
        (out / "histories.json").write_text(json.dumps(histories))


def resumed_on_one_rank(rank: int, assets: SFTAssets, out: Path) -> None:
    (out / "history_ws1.json").write_text(json.dumps(run_sft(sft_config(job(assets, out / "c", TOTAL)))))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict[str, dict[int, dict]], Path]:
    out = tmp_path_factory.mktemp("sft_resume")
    run_ranks(uninterrupted_then_stopped_and_resumed, 2, sft_assets(), out)
    run_ranks(resumed_on_one_rank, 1, sft_assets(), out)
    histories = json.loads((out / "histories.json").read_text())
    histories["resumed_ws1"] = json.loads((out / "history_ws1.json").read_text())
    return {name: {entry["step"]: entry for entry in history} for name, history in histories.items()}, out


def test_resumed_steps_repeat_the_uninterrupted_run_exactly(runs):
    by_step, _ = runs
    assert sorted(by_step["stopped"]) == list(range(0, STOP + 1))
    assert sorted(by_step["resumed"]) == list(range(STOP + 1, TOTAL + 1)), "the resumed run starts after step 3"
    for step in range(1, TOTAL + 1):
        run = "stopped" if step <= STOP else "resumed"
        for key in KEYS:
            assert by_step[run][step][key] == by_step["uninterrupted"][step][key], (step, key)
    assert by_step["resumed"][TOTAL]["val/loss"] == by_step["uninterrupted"][TOTAL]["val/loss"]
    losses = [by_step["uninterrupted"][s]["train/loss"] for s in range(1, TOTAL + 1)]
    assert losses[-1] < losses[0], "the job must actually train"


def test_validation_loss_over_two_ranks_is_the_plain_token_mean(runs):
    """Step 0's val/loss (24 samples in padded batches of 5 over 2 ranks) against one plain forward."""
    by_step, _ = runs
    assets = sft_assets()
    dataset = SFTDataset(assets.data["sft_val"], load_tokenizer(assets.model))
    batch = dataset.collate(list(range(len(dataset))))
    model = AutoModelForCausalLM.from_pretrained(assets.model, dtype=torch.float32)
    input_ids, mask = batch.batch["input_ids"], batch.batch["loss_mask"][:, 1:].float()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=batch.batch["attention_mask"]).logits
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    plain = (-(log_probs * mask).sum() / mask.sum()).item()
    assert by_step["uninterrupted"][0]["val/loss"] == pytest.approx(plain, rel=1e-5)


def test_checkpoint_folders_and_metrics_log_after_resume(runs):
    _, out = runs
    run_dir = out / "b"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(TOTAL)
    for step in (STOP, TOTAL):
        assert (run_dir / f"global_step_{step}" / "driver_state.pt").is_file()
        assert (run_dir / f"global_step_{step}" / "engine" / "engine_meta.json").is_file()
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(0, TOTAL + 1)), "every step logged exactly once across the stop and the resume"
    assert (run_dir / "hf" / "config.json").is_file()


def test_a_two_rank_checkpoint_continues_on_one_rank_with_the_same_losses(runs):
    by_step, out = runs
    assert sorted(by_step["resumed_ws1"]) == list(range(STOP + 1, TOTAL + 1)), "run C resumes after step 3"
    for step in range(STOP + 1, TOTAL + 1):
        one_rank, reference = by_step["resumed_ws1"][step], by_step["uninterrupted"][step]
        assert one_rank["train/lr"] == reference["train/lr"], step
        assert abs(one_rank["train/loss"] - reference["train/loss"]) <= RESHARD_LOSS_TOL, (step, one_rank, reference)
        assert one_rank["train/grad_norm"] == pytest.approx(reference["train/grad_norm"], rel=1e-4), step
    assert by_step["resumed_ws1"][TOTAL]["val/loss"] == pytest.approx(by_step["uninterrupted"][TOTAL]["val/loss"], abs=1e-5)
    meta = json.loads((out / "c" / f"global_step_{TOTAL}" / "engine" / "engine_meta.json").read_text())
    assert meta["world_size"] == 1, "the step-6 checkpoint of run C was written by one rank"
