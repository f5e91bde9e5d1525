"""State files rlflow writes load with weights_only=True; older pickled ones fail in one line."""

import random

import numpy as np
import pytest
import torch

from rlflow.engines.common.checkpoint.checkpointing import load_rng, save_rng
from rlflow.errors import CheckpointError
from rlflow.trainer.checkpoint import DRIVER_STATE, CheckpointManager
from rlflow.utils.seed import get_rng_state, set_rng_state, set_seed


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), np.random.rand(), np.random.randn(), torch.rand(2).tolist()


def test_rng_state_survives_a_weights_only_file_and_continues_every_stream(tmp_path):
    set_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave cached gaussians in both states
    save_rng(tmp_path, rank=0)
    expected = draws()
    set_seed(99)
    load_rng(tmp_path, rank=0)
    assert draws() == expected
    torch.load(tmp_path / "rng_rank0.pt", weights_only=True)


def test_rng_state_round_trips_in_memory():
    set_seed(5)
    state = get_rng_state()
    expected = draws()
    set_rng_state(state)
    assert draws() == expected


def test_driver_state_loads_weights_only(tmp_path):
    manager = CheckpointManager(tmp_path)
    state = {"global_step": 2, "dataloader": {"epoch": 0, "next_batch": 1, "shuffle": True}, "kl_coef": 0.1,
             "rng": get_rng_state()}
    folder = manager.save(2, state, lambda partial: None)
    loaded = manager.load_driver_state(folder)
    assert loaded["dataloader"] == state["dataloader"] and loaded["kl_coef"] == 0.1
    assert torch.equal(loaded["rng"]["numpy"]["words"], state["rng"]["numpy"]["words"])


@pytest.mark.parametrize("kind", ["driver", "rng"])
def test_old_pickled_state_files_fail_in_one_line(tmp_path, kind):
    old_state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if kind == "driver":
        folder = tmp_path / "global_step_1"
        folder.mkdir()
        torch.save({"global_step": 1, "rng": old_state}, folder / DRIVER_STATE)
        load = lambda: CheckpointManager(tmp_path).load_driver_state(folder)  # noqa: E731
    else:
        torch.save(old_state, tmp_path / "rng_rank0.pt")
        load = lambda: load_rng(tmp_path, rank=0)  # noqa: E731
    with pytest.raises(CheckpointError, match="needs unpickling of arbitrary python objects") as err:
        load()
    assert "\n" not in str(err.value)


def test_a_crafted_state_file_runs_no_code(tmp_path):
    class Payload:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    torch.save({"rng": Payload()}, tmp_path / "rng_rank0.pt")
    with pytest.raises(CheckpointError):
        load_rng(tmp_path, rank=0)
