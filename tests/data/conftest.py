"""Shared fixtures for the dataset tests: the preset's tokenizer and small data files written per test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.tokenizer_builder import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny preset's tokenizer (byte-level BPE with the Qwen-style chat template), trained offline."""
    return train_tokenizer(tokenizer_corpus())


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` as parquet or jsonl, chosen by the suffix of ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _rl_row(i: int, content: str | None = None) -> dict[str, Any]:
    """A valid verl-format RL row."""
    return {
        "data_source": "synthetic/addition",
        "prompt": [{"role": "user", "content": content or f"What is {i}+{i}? Answer with the number after ####."}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"index": i},
    }


@pytest.fixture
def write_rows():
    """``write_rows(path, rows)``: write rows as parquet or jsonl by suffix; returns the path."""
    return _write_rows


@pytest.fixture
def rl_row():
    """``rl_row(i, content=None)``: a valid verl-format RL row."""
    return _rl_row
