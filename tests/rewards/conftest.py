"""Shared fixtures for the reward tests: the preset's tokenizer and a registry snapshot."""

from __future__ import annotations

import pytest

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.tokenizer_builder import train_tokenizer
from rlflow.rewards import REWARD_REGISTRY


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny preset's tokenizer, trained offline."""
    return train_tokenizer(tokenizer_corpus())


@pytest.fixture
def clean_registry():
    """Restore the reward registry after a test that registers functions."""
    with REWARD_REGISTRY.temporary():
        yield REWARD_REGISTRY
