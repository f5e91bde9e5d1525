"""Rollout test fixtures: the tiny preset (built once per session), its HF model and tokenizer, and the
clean-up of an in-process engine's process group."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from rlflow.models.loading import load_causal_lm, load_tokenizer
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    return build_preset(tmp_path_factory.mktemp("rollout-preset") / "tiny", tokenizer_corpus(), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    return load_tokenizer(tiny_path)


@pytest.fixture()
def hf_model(tiny_path):
    """A fresh fp32 HF model of the preset (tests may change its weights)."""
    return load_causal_lm(tiny_path, dtype="float32").eval()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session (short temp dir, 8 logical CPUs) for the rollout modules that need workers."""
    import shutil
    import tempfile

    from rlflow.workers import init_ray, shutdown_ray

    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
    init_ray(num_cpus=8, temp_dir=temp_dir)
    yield
    shutdown_ray()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def in_process_group():
    """An engine built in the test creates this process's (one-rank) default group; destroy it after the
    test so later tests in the same pytest process can create theirs."""
    assert not dist.is_initialized(), "an earlier test left a default process group behind"
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
