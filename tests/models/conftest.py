"""Shared fixtures: preset folders built once per test session."""

from __future__ import annotations

import pytest

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset

# The 4-layer preset of each architecture.
ARCHITECTURE_PRESETS = ("tiny-qwen2", "tiny-qwen3", "tiny-llama")


@pytest.fixture(scope="session")
def tiny_preset(tmp_path_factory):
    """Path to a tiny preset built with seed 0."""
    return build_preset(tmp_path_factory.mktemp("preset") / "tiny", tokenizer_corpus(), "tiny", seed=0)


@pytest.fixture(scope="session")
def architecture_presets(tmp_path_factory):
    """``{name: path}`` of the ``ARCHITECTURE_PRESETS``, built with seed 0."""
    root = tmp_path_factory.mktemp("arch-presets")
    return {name: build_preset(root / name, tokenizer_corpus(), name, seed=0) for name in ARCHITECTURE_PRESETS}
