"""The weight-sync fast paths: the prefetching split stream (order, bit-equality, bounded buckets in
flight) and the colocated export (no copy and no cast when nothing needs one)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlflow.engines import build_engine
from rlflow.rollout.weight_sync import iter_buckets, prefetched, publish_weights, stream_published_weights


def _mixed_tensors() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (f"layer{i}.{kind}", tensor)
        for i in range(6)
        for kind, tensor in (
            ("w", torch.randn(64, 48, generator=generator)),
            ("bf", torch.randn(40, generator=generator).to(torch.bfloat16)),
            ("strided", torch.randn(16, 12, generator=generator)[:, ::3]),
            ("ids", torch.arange(7)),
        )
    ]


def test_prefetch_keeps_order_and_bounds_the_items_in_flight():
    fetched, consumed, in_flight = [], [], []
    lock = threading.Lock()

    def fetch(item: int) -> list[int]:
        time.sleep(0.002)
        with lock:
            fetched.append(item)
            in_flight.append(len(fetched) - len(consumed))
        return [item * 10, item * 10 + 1]

    for value in prefetched(range(12), fetch, depth=2):
        if value % 10 == 1:  # the last element of an item: it is consumed
            time.sleep(0.004)  # a slow consumer lets the fetcher run ahead as far as it may
            with lock:
                consumed.append(value // 10)
    assert consumed == list(range(12)) and fetched == list(range(12))
    assert max(in_flight) == 3  # depth 2 ahead + the one being consumed, never more


def test_prefetch_depth_zero_fetches_one_at_a_time():
    seen = []
    values = list(prefetched([1, 2, 3], lambda item: seen.append(item) or [item], depth=0))
    assert values == [1, 2, 3] and seen == [1, 2, 3]
    with pytest.raises(ValueError, match="depth"):
        list(prefetched([1], lambda item: [item], depth=-1))


def test_split_stream_delivers_every_tensor_in_order_bit_equal(ray_session):
    tensors = _mixed_tensors()
    refs = publish_weights(tensors, bucket_mb=0.02)
    assert len(refs) == len(list(iter_buckets(tensors, 0.02))) > 3
    received = list(stream_published_weights(refs, prefetch=1))
    assert [name for name, _ in received] == [name for name, _ in tensors]
    for (_, want), (_, got) in zip(tensors, received):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))


def test_colocated_export_copies_and_casts_only_when_needed(tiny_path, in_process_group):
    engine = build_engine({"name": "fsdp2", "device": "cpu", "micro_batch_size": 1, "optimizer": {"lr": 1e-5}}, tiny_path)
    engine.initialize()
    params = [p.detach().to_local() for p in engine.module.parameters()]
    same = list(engine.export_hf_weights(dtype=torch.float32))
    assert len(same) == len(params)
    assert all(t.data_ptr() == p.data_ptr() for (_, t), p in zip(same, params))  # world size 1: no gather, no cast
    cast = list(engine.export_hf_weights(dtype=torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for _, t in cast)
    assert all(torch.equal(t, p.to(torch.bfloat16)) for (_, t), p in zip(cast, params))
