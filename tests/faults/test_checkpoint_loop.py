"""The driver loop's order (a step is logged before it is checkpointed), SIGTERM and the divergence guard's
counts across a resume, on the SFT loop with a stand-in group."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Optional

import pytest
import torch

from rlflow.protocol import DataProto
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.entry_points import compose_sft_config
from rlflow.trainer.divergence import DivergenceError, DivergenceGuard
from rlflow.trainer.preemption import PreemptionFlag
from rlflow.trainer.sft_trainer import SFTRun, SFTTrainer
from rlflow.workers import MeshTable


class Loader:
    """Four one-row batches per epoch, with a resumable position."""

    def __init__(self):
        self.position = 0

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        while self.position < len(self):
            self.position += 1
            yield DataProto.from_dict({"attention_mask": torch.ones(1, 3, dtype=torch.long)})
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class Group:
    """A one-rank stand-in for the SFT worker group that records what the loop asks, in order."""

    def __init__(self, events: list, sigterm_at_step: int = 0, skip_every_step: bool = False):
        self.events, self.sigterm_at_step, self.steps = events, sigterm_at_step, 0
        self.skip_every_step = skip_every_step

    def mesh_table(self, mesh_name: str) -> MeshTable:
        return MeshTable.data_parallel(1)

    def forward_backward(self, batch: DataProto) -> dict:
        self.steps += 1
        if self.steps == self.sigterm_at_step:
            os.kill(os.getpid(), signal.SIGTERM)  # preemption arrives in the middle of the step
        return {"loss": 1.0, "num_tokens": 3}

    def optim_step(self) -> list:
        skipped = self.skip_every_step  # the engine contract's keys
        return [{"grad_norm": math.nan if skipped else 1.0, "lr": 0.1, "skipped": skipped, "skipped_steps": self.steps * skipped}]

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        self.events.append(("save", int(Path(path).parent.name.split("_")[-1].removesuffix(".partial"))))

    def load_checkpoint(self, path: str) -> None:
        self.events.append(("load", path))

    def save_hf(self, path: str) -> None:
        self.events.append(("export", path))


class Tracking:
    def __init__(self, events: list):
        self.events = events

    def log(self, metrics: dict, step: int) -> None:
        self.events.append(("log", step))


def trainer(tmp_path: Path, events: list, sigterm_at_step: int = 0, save_freq: int = 2,
            skip_every_step: bool = False, guard: Optional[DivergenceGuard] = None) -> SFTTrainer:
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": []}\n')
    config = compose_sft_config([f"trainer.default_local_dir={tmp_path / 'run'}", f"data.train_files=[{data}]",
                         "data.train_batch_size=1", f"trainer.save_freq={save_freq}", "trainer.val_before_train=false"])
    run = SFTRun(train_loader=Loader(), val_loader=None, engine_config={}, total_steps=4,
                 guard=guard or DivergenceGuard())
    return SFTTrainer(config, Group(events, sigterm_at_step, skip_every_step), run, Tracking(events))


def test_each_step_is_logged_before_its_checkpoint(tmp_path):
    events: list = []
    trainer(tmp_path, events).fit()
    assert events == [("log", 1), ("log", 2), ("save", 2), ("log", 3), ("log", 4), ("save", 4),
                      ("export", str(tmp_path / "run" / "hf"))]


def test_sigterm_checkpoints_the_current_step_and_returns_without_export(tmp_path):
    events: list = []
    previous = signal.getsignal(signal.SIGTERM)
    history = trainer(tmp_path, events, sigterm_at_step=3, save_freq=-1).fit()
    assert [entry["step"] for entry in history] == [1, 2, 3]
    assert events == [("log", 1), ("log", 2), ("log", 3), ("save", 3)]
    assert CheckpointManager(tmp_path / "run").complete_steps() == [3]
    assert signal.getsignal(signal.SIGTERM) == previous, "the loop's handler is removed when it ends"

    events.clear()  # the same command again resumes after step 3 and finishes
    history = trainer(tmp_path, events, save_freq=-1).fit()
    assert [entry["step"] for entry in history] == [4]
    assert events[-2:] == [("save", 4), ("export", str(tmp_path / "run" / "hf"))]


def test_a_resumed_run_continues_the_count_of_skipped_steps_from_the_checkpoint(tmp_path):
    """The guard's counts travel in driver_state.pt: 2 skipped steps, a checkpoint, a resume, 2 more reach the limit 4."""
    events: list = []
    history = trainer(tmp_path, events, sigterm_at_step=2, save_freq=-1, skip_every_step=True,
                      guard=DivergenceGuard(max_consecutive_skipped_steps=4)).fit()
    assert [entry["train/consecutive_skipped_steps"] for entry in history] == [1, 2]
    assert CheckpointManager(tmp_path / "run").complete_steps() == [2]

    resumed = trainer(tmp_path, events, save_freq=-1, skip_every_step=True, guard=DivergenceGuard(max_consecutive_skipped_steps=4))
    with pytest.raises(DivergenceError, match=r"^train: 4 optimizer steps in a row were skipped"):
        resumed.fit()  # a count restarted at 0 would be 2 at step 4, under the limit
    assert [entry["train/consecutive_skipped_steps"] for entry in resumed.history] == [3]


def test_the_preemption_flag_only_turns_sigterm_into_a_request():
    with PreemptionFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested
