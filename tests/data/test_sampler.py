"""Resumable batching: epoch sizes, seeded shuffles, and resumed runs that see exactly the same batches."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlflow.config.schema import DataConfig
from rlflow.data.rl_dataset import build_rl_loader
from rlflow.data.sampler import ResumableBatchSampler
from rlflow.errors import UserError


def take(batches, n_batches: int) -> list:
    """The next ``n_batches`` of a sampler or loader, iterating epoch after epoch like a training loop."""
    out: list = []
    while len(out) < n_batches:
        out.extend(itertools.islice(iter(batches), n_batches - len(out)))
    return out


@pytest.mark.parametrize("drop_last,expected_len,sizes", [(True, 3, [3, 3, 3]), (False, 4, [3, 3, 3, 1])])
def test_drop_last_sets_batches_per_epoch(drop_last, expected_len, sizes):
    sampler = ResumableBatchSampler(10, 3, shuffle=True, seed=1, drop_last=drop_last)
    assert len(sampler) == expected_len
    epoch0 = list(sampler)
    assert [len(b) for _, b in epoch0] == sizes and {e for e, _ in epoch0} == {0}
    seen = [i for _, b in epoch0 for i in b]
    assert len(set(seen)) == len(seen) == sum(sizes)
    assert sampler.epoch == 1 and sampler.next_batch == 0


def test_shuffle_is_seeded_per_epoch():
    a, b = ResumableBatchSampler(20, 4, seed=3), ResumableBatchSampler(20, 4, seed=3)
    orders = [a.epoch_order(e).tolist() for e in range(3)]
    assert orders == [b.epoch_order(e).tolist() for e in range(3)]
    assert all(sorted(o) == list(range(20)) for o in orders)
    assert orders[0] != orders[1] != orders[2]
    assert ResumableBatchSampler(20, 4, seed=4).epoch_order(0).tolist() != orders[0]
    assert ResumableBatchSampler(20, 4, shuffle=False).epoch_order(7).tolist() == list(range(20))


@pytest.mark.parametrize("cut", [1, 3, 4, 6, 9])  # mid-epoch, end of epoch, start of epoch...
def test_resumed_sampler_yields_identical_batches(cut):
    reference = take(ResumableBatchSampler(13, 4, seed=7), 10)
    first = ResumableBatchSampler(13, 4, seed=7)
    before = take(first, cut)
    state = first.state_dict()
    resumed = ResumableBatchSampler(13, 4, seed=7)
    resumed.load_state_dict(state)
    assert before + take(resumed, 10 - cut) == reference


def test_resume_refuses_changed_settings():
    state = ResumableBatchSampler(13, 4, seed=7).state_dict()
    with pytest.raises(UserError, match="seed: 7 -> 8"):
        ResumableBatchSampler(13, 4, seed=8).load_state_dict(state)
    with pytest.raises(UserError, match="num_samples: 13 -> 14"):
        ResumableBatchSampler(14, 4, seed=7).load_state_dict(state)


def test_dataset_smaller_than_a_batch_is_an_error():
    with pytest.raises(UserError, match="fewer than one batch"):
        ResumableBatchSampler(3, 4, drop_last=True)
    assert len(ResumableBatchSampler(3, 4, drop_last=False)) == 1


def test_rl_loader_resume_gives_identical_dataprotos(tmp_path, tokenizer, write_rows, rl_row):
    train = write_rows(tmp_path / "train.parquet", [rl_row(i) for i in range(11)])
    val = write_rows(tmp_path / "val.jsonl", [rl_row(i) for i in range(100, 105)])
    config = DataConfig(train_files=[str(train)], val_files=[str(val)], train_batch_size=4, seed=5, max_prompt_length=40)

    reference = take(build_rl_loader(config, tokenizer, "train"), 6)
    assert len(build_rl_loader(config, tokenizer, "train")) == 2  # 11 // 4
    first = build_rl_loader(config, tokenizer, "train")
    head = take(first, 3)
    resumed = build_rl_loader(config, tokenizer, "train")
    resumed.load_state_dict(first.state_dict())
    assert resumed.epoch == 1
    batches = head + take(resumed, 3)
    for got, want in zip(batches, reference, strict=True):
        assert torch.equal(got.batch["input_ids"], want.batch["input_ids"])
        assert list(got.non_tensor_batch["uid"]) == list(want.non_tensor_batch["uid"])
        assert list(got.non_tensor_batch["ground_truth"]) == list(want.non_tensor_batch["ground_truth"])
    uids = [u for b in reference for u in b.non_tensor_batch["uid"]]
    assert len(set(uids)) == len(uids)

    val_loader = build_rl_loader(config, tokenizer, "val")
    (val_batch,) = list(val_loader)
    assert list(val_batch.non_tensor_batch["ground_truth"]) == [str(2 * i) for i in range(100, 105)]
