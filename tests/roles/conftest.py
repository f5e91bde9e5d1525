"""The role suite's shared fixtures: the models (built once per session) and the process group real roles join.

* ``models``: the tiny preset (``causal``) and a value model made from it (``value``: a seeded random
  score head, tokenizer files beside it, as TRL and OpenRLHF save a reward model);
* ``hf_causal`` / ``hf_value``: the same folders loaded as plain HF models, for the references;
* ``worker_env``: the environment a worker group gives rank 0 of a one-process group (a ``Worker``
  joins it on construction); afterwards the process group is destroyed and the environment restored,
  so later tests in this process start clean.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.workers.worker import ENV_DEVICE, find_free_port


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("role_models")
    causal = build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
    torch.manual_seed(123)
    value = AutoModelForSequenceClassification.from_pretrained(causal, num_labels=1)
    value.save_pretrained(root / "value")
    for file in causal.iterdir():
        if file.name.startswith("tokenizer"):
            (root / "value" / file.name).write_bytes(file.read_bytes())
    return SimpleNamespace(causal=causal, value=root / "value", vocab=value.config.vocab_size)


@pytest.fixture(scope="session")
def hf_causal(models: SimpleNamespace):
    return AutoModelForCausalLM.from_pretrained(models.causal, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_value(models: SimpleNamespace):
    return AutoModelForSequenceClassification.from_pretrained(models.value, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def worker_env() -> Iterator[None]:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(find_free_port()), ENV_DEVICE: "cpu"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield
        if dist.is_initialized():
            dist.destroy_process_group()
