"""Weight-sync building blocks: bucketing bounds, packed buckets, name checks."""

from __future__ import annotations

import pytest
import torch

from rlflow.rollout.weight_sync import (
    MiB,
    CheckedWeightStream,
    WeightSyncError,
    checkpoint_weight_names,
    iter_buckets,
    pack_bucket,
    unpack_bucket,
)


def _tensors():
    return [
        ("a", torch.zeros(64 * 1024)),  # 0.25 MiB fp32
        ("b", torch.zeros(64 * 1024)),
        ("c", torch.zeros(512 * 1024)),  # 2 MiB: larger than the bound
        ("d", torch.zeros(16, dtype=torch.bfloat16)),
        ("e", torch.zeros(128 * 1024)),
    ]


def test_buckets_respect_the_bound_and_keep_order():
    buckets = list(iter_buckets(_tensors(), bucket_mb=0.6))
    assert [[name for name, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d", "e"]]
    for bucket in buckets:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= 0.6 * MiB or len(bucket) == 1


def test_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match="weight_sync_bucket_mb"):
        list(iter_buckets(_tensors(), 0))


def test_pack_unpack_round_trip_all_dtypes():
    bucket = [
        ("w", torch.randn(3, 5)),
        ("bf", torch.randn(7).to(torch.bfloat16)),
        ("half", torch.randn(2, 2).to(torch.float16)),
        ("ids", torch.arange(6).reshape(2, 3)),
        ("scalar", torch.tensor(2.5)),
        ("view", torch.randn(4, 6)[:, ::2]),  # non-contiguous
    ]
    restored = unpack_bucket(pack_bucket(bucket))
    assert [n for n, _ in restored] == [n for n, _ in bucket]
    for (_, want), (_, got) in zip(bucket, restored):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_checked_stream_refuses_unknown_repeated_and_missing_names():
    expected = frozenset({"x", "y"})
    with pytest.raises(WeightSyncError, match="'z'"):
        list(CheckedWeightStream([("x", torch.zeros(1)), ("z", torch.zeros(1))], expected))
    with pytest.raises(WeightSyncError, match="twice"):
        list(CheckedWeightStream([("x", torch.zeros(1)), ("x", torch.zeros(1))], expected))
    stream = CheckedWeightStream([("x", torch.zeros(2))], expected)
    assert len(list(stream)) == 1 and stream.bytes_seen == 8
    with pytest.raises(WeightSyncError, match=r"1 tensors .*'y'"):
        stream.finish()


def test_checkpoint_names_match_the_model(tiny_path, hf_model):
    assert checkpoint_weight_names(tiny_path) == frozenset(hf_model.state_dict())
