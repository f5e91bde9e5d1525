"""Seeding and RNG-state capture for python, numpy and torch.

The captured state holds only tensors, numbers and strings, so a checkpoint stores it with
``torch.save`` and reads it back with ``torch.load(weights_only=True)`` (no unpickling of
arbitrary objects): python's and numpy's Mersenne-Twister words travel as int64 tensors.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def get_rng_state() -> dict[str, Any]:
    """Everything needed to continue the random streams exactly (for checkpoints), weights_only-safe."""
    py_version, py_words, py_gauss = random.getstate()
    np_name, np_words, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": py_version, "words": torch.tensor(py_words, dtype=torch.int64), "gauss_next": py_gauss},
        "numpy": {"name": str(np_name), "words": torch.from_numpy(np_words.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state captured by ``get_rng_state``."""
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["words"].tolist()), py["gauss_next"]))
    np.random.set_state((npy["name"], npy["words"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
