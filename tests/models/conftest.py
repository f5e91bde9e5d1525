"""Shared fixture: one tiny preset folder built per test session."""

from __future__ import annotations

import pytest

from rlflow.models.presets import build_preset


@pytest.fixture(scope="session")
def tiny_preset(tmp_path_factory):
    """Path to a tiny preset built with seed 0."""
    return build_preset(tmp_path_factory.mktemp("preset") / "tiny", size="tiny", seed=0)
