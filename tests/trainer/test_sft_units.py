"""Units of the SFT driver: loop length, validation padding, launcher and batch-size checks, the loss."""

from __future__ import annotations

import types

import pytest
import torch

from rlflow.config import ConfigError
from rlflow.engines import LossContext
from rlflow.engines.config import EngineConfigError
from rlflow.protocol import DataProto
from rlflow.roles.sft_worker import sft_loss
from rlflow.trainer.sft_trainer import SFTRun, SFTTrainer, pad_batch_without_loss, prepare_sft_run, total_training_steps
from rlflow.workers import MeshTable
from sft_testlib import sft_assets, sft_config


def trainer_config(**values):
    return types.SimpleNamespace(**{"total_training_steps": None, "total_epochs": 1, **values})


def test_total_steps_from_epochs_or_explicit_steps():
    assert total_training_steps(trainer_config(total_epochs=3), steps_per_epoch=7) == 21
    assert total_training_steps(trainer_config(total_training_steps=5, total_epochs=3), steps_per_epoch=7) == 5
    with pytest.raises(ConfigError, match="trainer.total_training_steps"):
        total_training_steps(trainer_config(total_training_steps=0), steps_per_epoch=7)
    with pytest.raises(ConfigError, match="trainer.total_epochs"):
        total_training_steps(trainer_config(total_epochs=0), steps_per_epoch=7)


def test_validation_padding_rows_carry_no_loss():
    batch = DataProto.from_dict({
        "input_ids": torch.arange(15).reshape(5, 3),
        "attention_mask": torch.ones(5, 3, dtype=torch.long),
        "loss_mask": torch.ones(5, 3, dtype=torch.long),
    })
    padded = pad_batch_without_loss(batch, 4)
    assert len(padded) == 8
    assert padded.batch["loss_mask"][:5].sum() == 15 and padded.batch["loss_mask"][5:].sum() == 0
    assert batch.batch["loss_mask"].sum() == 15, "the input batch is left untouched"
    assert pad_batch_without_loss(batch, 5) is batch


def test_sft_loss_is_the_global_token_mean_scaled_for_the_dp_average():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    loss_mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    micro = DataProto.from_dict({"loss_mask": loss_mask, "input_ids": torch.zeros(2, 3, dtype=torch.long)})
    ctx = LossContext(global_num_tokens=10, global_num_seqs=4, dp_size=2, num_micro_batches=1, micro_batch_index=0)
    loss, _ = sft_loss({"log_probs": log_probs}, micro, ctx)
    assert loss.item() == pytest.approx(2 * (2.0 + 3.0 + 4.0) / 10)


def test_unknown_launcher_is_a_config_error(tmp_path):
    """Config loading rejects it (rlflow/config/loading/choices.py), before any launcher runs."""
    with pytest.raises(ConfigError, match="trainer.launcher.*ray, torchrun"):
        sft_config([f"trainer.default_local_dir={tmp_path}", "trainer.launcher=slurm"])


class _GroupOfDP:
    """Stands in for a worker group: only its DP layout is asked for."""

    def __init__(self, dp_size: int):
        self.dp_size = dp_size

    def mesh_table(self, mesh_name: str) -> MeshTable:
        return MeshTable.data_parallel(self.dp_size)


def test_batch_size_must_split_evenly_over_data_parallel_ranks(tmp_path):
    config = sft_config([f"trainer.default_local_dir={tmp_path}", "data.train_batch_size=6"])
    run = SFTRun(train_loader=[], val_loader=None, engine_config={}, total_steps=1)
    SFTTrainer(config, _GroupOfDP(3), run)
    with pytest.raises(ConfigError, match=r"data.train_batch_size.*6.*data-parallel size 4"):
        SFTTrainer(config, _GroupOfDP(4), run)


def test_a_smoke_run_shorter_than_the_default_warmup_fits_its_schedule(tmp_path, caplog):
    """The SFT default (cosine, 20 warmup steps) under a 3-step smoke run: shortened before any worker starts, with
    a line saying so; an explicit total_steps the schedule cannot use is one line naming the key."""
    assets = sft_assets()
    base = [f"trainer.default_local_dir={tmp_path}", f"data.train_files=[{assets.data['sft_train']}]",
            "data.val_files=[]", f"model.path={assets.model}", "trainer.total_training_steps=3"]
    with caplog.at_level("WARNING"):
        run = prepare_sft_run(sft_config(base), assets.model, 1)
    schedule = run.engine_config["lr_scheduler"]
    assert (schedule["name"], schedule["warmup_steps"], schedule["total_steps"]) == ("cosine", 2, 3)
    assert "engine.lr_scheduler.warmup_steps=20 does not end within the run's 3 optimizer steps" in caplog.text
    with pytest.raises(EngineConfigError, match=r"^config key 'engine.lr_scheduler.total_steps': .*got total_steps=5"):
        prepare_sft_run(sft_config(base + ["engine.lr_scheduler.total_steps=5"]), assets.model, 1)
