"""DataProto files: no pickle for tensors and plain columns; other objects only on opt-in."""

import pickle
import zipfile

import numpy as np
import pytest
import torch

from rlflow.protocol import DataProto, DataProtoError


class Marker:
    """A python object outside the plain types (module-level so that pickle can find it)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Marker) and other.value == self.value


def plain_batch() -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.randn(3, 2).to(torch.bfloat16), "mask": torch.tensor([True, False, True])},
        non_tensors={"uid": ["a", "b", "c"], "extra": [{"i": 1, "tags": ["t"]}, None, {"i": 3, "pair": (1, 2.5)}]},
        meta_info={"temperature": 0.7, "counts": [1, 2], "name": "x"},
    )


def pickled_names(path) -> list[str]:
    """Class references in the file's pickle stream (GLOBAL opcodes name module and class)."""
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    return [str(arg) for op, arg, _ in __import__("pickletools").genops(data) if op.name in ("GLOBAL", "STACK_GLOBAL")
            and arg is not None]


def test_plain_batch_round_trips_without_pickle(tmp_path):
    data = plain_batch()
    path = tmp_path / "b.dp"
    data.save_to_disk(path)
    assert not any("numpy" in n or "rlflow" in n for n in pickled_names(path))  # only torch's own rebuild helpers
    torch.load(path, weights_only=True)  # the whole file passes torch's restricted unpickler
    loaded = DataProto.load_from_disk(path)
    assert loaded.batch["x"].dtype == torch.bfloat16 and torch.equal(loaded.batch["x"], data.batch["x"])
    assert torch.equal(loaded.batch["mask"], data.batch["mask"])
    assert loaded.non_tensor_batch["extra"].tolist() == data.non_tensor_batch["extra"].tolist()
    assert loaded.non_tensor_batch["extra"][2]["pair"] == (1, 2.5)
    assert loaded.meta_info == data.meta_info


def test_saving_a_slice_stores_only_its_rows(tmp_path):
    big = DataProto.from_dict({"x": torch.zeros(10_000, 100)})
    big[:2].save_to_disk(tmp_path / "s.dp")
    assert (tmp_path / "s.dp").stat().st_size < 100_000


@pytest.mark.parametrize("where", ["column", "meta"])
def test_python_objects_need_allow_pickle_and_the_error_names_them(tmp_path, where):
    data = plain_batch()
    if where == "column":
        data.non_tensor_batch["obj"] = np.array([Marker(1), Marker(2), Marker(3)], dtype=object)
        expected = "non-tensor column 'obj'"
    else:
        data.meta_info["obj"] = np.float32(1.5)
        expected = "meta_info key 'obj'"
    path = tmp_path / "o.dp"
    data.save_to_disk(path)
    with pytest.raises(DataProtoError, match=f"{expected} holds python objects.*allow_pickle=True") as err:
        DataProto.load_from_disk(path)
    assert "\n" not in str(err.value)
    loaded = DataProto.load_from_disk(path, allow_pickle=True)
    if where == "column":
        assert loaded.non_tensor_batch["obj"].tolist() == [Marker(1), Marker(2), Marker(3)]
    else:
        assert loaded.meta_info["obj"] == np.float32(1.5) and type(loaded.meta_info["obj"]) is np.float32


class Payload:
    """Unpickling this would run code: the loader must refuse before any of it happens."""

    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def test_old_pickle_files_are_refused_before_any_unpickling(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(Payload(), protocol=5))
    with pytest.raises(DataProtoError, match="needs unpickling of arbitrary python objects") as err:
        DataProto.load_from_disk(path)
    assert "\n" not in str(err.value)
    zipped = tmp_path / "evil.pt"
    torch.save({"format": "rlflow.DataProto/2", "batch": Payload()}, zipped)
    with pytest.raises(DataProtoError, match="needs unpickling"):
        DataProto.load_from_disk(zipped)
