"""Fixtures of the service tests (the server itself: service_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_preset(tmp_path_factory.mktemp("service-preset") / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
