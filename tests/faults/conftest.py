"""The tiny model and the addition task the fault tests' runs train on (``fault_assets``, built once per module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset


@pytest.fixture(scope="module")
def fault_assets(tmp_path_factory) -> dict[str, Path]:
    """``model``: the tiny preset's folder; ``data``: the 2-digit addition task (64 train rows, 8 val rows)."""
    root = tmp_path_factory.mktemp("assets")
    data = root / "addition"
    write_task_files(build_task("addition", digits=2), data, n_train=64, n_val=8, seed=0)
    return {"model": build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0), "data": data}
