"""The engine suite's launches, shared by its test modules (session fixtures: each launch runs once).

* ``two_rank``: ``engine_scenarios.two_rank_suites`` on 2 ranks (parity, accumulation, checkpoints, export, value);
* ``killed``: a 1-rank save SIGKILLed mid-write (``checkpoint_scenarios.killed_save``);
* ``one_rank``: ``engine_scenarios.one_rank_suites`` on 1 rank, after both (it reads their checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForSequenceClassification

from checkpoint_scenarios import killed_save
from engine_scenarios import one_rank_suites, two_rank_suites
from engine_testlib import build_test_model, spawn


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_model(tmp_path_factory.mktemp("engine_model") / "tiny")


@pytest.fixture(scope="session")
def two_rank(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    value_path = tmp_path_factory.mktemp("engine_value") / "value"
    torch.manual_seed(123)  # a random score head, saved as TRL/OpenRLHF save a reward model
    AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1).save_pretrained(value_path)
    for file in model_path.iterdir():  # tokenizer files beside the value model, like a real critic folder
        if file.name.startswith("tokenizer") and not (value_path / file.name).exists():
            (value_path / file.name).write_bytes(file.read_bytes())
    out = tmp_path_factory.mktemp("engine_ws2")
    spawn(two_rank_suites, 2, model_path, value_path, out)
    return out


@pytest.fixture(scope="session")
def killed(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("engine_killed")
    try:
        spawn(killed_save, 1, model_path, out)
        death = None
    except mp.ProcessExitedException as error:
        death = error
    return out, death


@pytest.fixture(scope="session")
def one_rank(model_path: Path, two_rank: Path, killed: tuple[Path, Any]) -> Path:
    out = killed[0]  # resume_after_kill reads the killed run's checkpoint from here
    spawn(one_rank_suites, 1, model_path, two_rank, out)
    return out
