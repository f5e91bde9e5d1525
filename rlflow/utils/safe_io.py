"""State files that load without unpickling arbitrary objects.

Every state file rlflow writes (driver state, RNG state, ``DataProto.save_to_disk``) is a
``torch.save`` of tensors, numbers, strings, ``None`` and lists/tuples/dicts of them, and is read
back with ``torch.load(weights_only=True)``: a crafted file cannot run code. ``load_weights_only``
turns the refusal of anything else (files from an older rlflow, or not from rlflow) into one
line. Python objects beyond these ``plain`` values (a numpy scalar in a non-tensor column, a
custom class in ``meta_info``) are stored as pickled bytes inside the file and unpickled only
when the caller passes ``allow_pickle=True`` to ``decode_values``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

_PLAIN_SCALARS = (str, int, float, bool, type(None))


class UnsafeContentError(ValueError):
    """A stored value needs unpickling and the caller did not allow it."""


def is_plain(value: Any) -> bool:
    """True if ``value`` is built only from str/int/float/bool/None, lists, tuples and str-keyed dicts."""
    if type(value) in _PLAIN_SCALARS:
        return True
    if type(value) in (list, tuple):
        return all(is_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    return False


def encode_values(value: Any) -> dict[str, Any]:
    """A weights_only-safe record of ``value`` (a plain value, a numpy object array, or anything else)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        flat = value.ravel().tolist()
        if all(is_plain(v) for v in flat):
            return {"kind": "object_array", "shape": list(value.shape), "values": flat}
    elif is_plain(value):
        return {"kind": "plain", "value": value}
    return {"kind": "pickle", "bytes": torch.frombuffer(bytearray(pickle.dumps(value, protocol=5)), dtype=torch.uint8)}


def decode_values(record: dict[str, Any], name: str, allow_pickle: bool = False) -> Any:
    """Invert ``encode_values``; a pickled record raises ``UnsafeContentError`` naming ``name`` unless allowed."""
    kind = record["kind"]
    if kind == "plain":
        return record["value"]
    if kind == "object_array":
        flat = np.empty(len(record["values"]), dtype=object)
        for i, v in enumerate(record["values"]):
            flat[i] = v
        return flat.reshape(record["shape"])
    if not allow_pickle:
        raise UnsafeContentError(
            f"{name} holds python objects that only unpickling can restore; pass allow_pickle=True if you trust the file"
        )
    return pickle.loads(record["bytes"].numpy().tobytes())


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save`` into ``path.tmp``, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def load_weights_only(path: str | Path, error_type: type[Exception]) -> Any:
    """``torch.load(path, weights_only=True)``; a file that needs full unpickling raises ``error_type`` in one line."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise error_type(
            f"{path} needs unpickling of arbitrary python objects to load, which rlflow refuses: it was written by "
            "an rlflow older than the weights_only state format, or not by rlflow; start from a newer checkpoint"
        ) from None
