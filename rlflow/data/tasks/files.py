"""Writing a synthetic task's RL and SFT parquet files."""

from __future__ import annotations

from pathlib import Path

from rlflow.data.files import write_parquet
from rlflow.data.outputs import check_outputs, record_outputs
from rlflow.data.tasks.base import SyntheticTask
from rlflow.data.tasks.splits import generate_splits, rl_row, sft_row

RL_FILES = {"train": "train.parquet", "val": "val.parquet"}
SFT_FILES = {"train": "sft_train.parquet", "val": "sft_val.parquet"}


def write_task_files(task: SyntheticTask, out_dir: str | Path, n_train: int, n_val: int, seed: int,
                     overwrite: bool = False) -> dict[str, Path]:
    """Write train/val.parquet (verl RL format) and sft_train/sft_val.parquet (``messages``) to ``out_dir``.

    Returns the written paths keyed ``train``, ``val``, ``sft_train``, ``sft_val``. Each file is
    written to a temp name and renamed, so a crash never leaves a half-written parquet. A file of
    those names is replaced only if an earlier call wrote it and ``overwrite`` is set (``outputs``);
    that is checked before any example is generated.
    """
    if n_train < 1 or n_val < 1:
        raise ValueError(f"train and val must each have at least 1 example, got train={n_train} val={n_val}")
    names = [*RL_FILES.values(), *SFT_FILES.values()]
    out = check_outputs(out_dir, names, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    train, val = generate_splits(task, n_train, n_val, seed)
    splits = {"train": train, "val": val}
    written: dict[str, Path] = {}
    for split, examples in splits.items():
        rl_rows = [rl_row(task, ex, split, i) for i, ex in enumerate(examples)]
        sft_rows = [sft_row(task, ex, split, i) for i, ex in enumerate(examples)]
        written[split] = write_parquet(rl_rows, out / RL_FILES[split])
        written[f"sft_{split}"] = write_parquet(sft_rows, out / SFT_FILES[split])
    record_outputs(out, names)
    return written
