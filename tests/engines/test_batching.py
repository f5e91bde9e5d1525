"""In-process unit tests of ``rlflow.engines.common.batching``: the micro-batch plan and the token streams
(packing); prefix sharing, ``sdpa_varlen`` and the packed-row search have their own test modules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlflow.engines.common.batching.micro_batching import plan_micro_batches
from rlflow.engines.common.batching.packing import first_fit_rows, make_token_stream, row_width
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY


# ------------------------------------------------------------------------------ micro-batching
def test_fixed_micro_batches_are_consecutive_and_bounded() -> None:
    plan = plan_micro_batches([5] * 10, micro_batch_size=4, use_dynamic_bsz=False, max_token_len=1)
    assert [len(g) for g in plan.groups] == [3, 4, 3]
    assert plan.order == list(range(10))


def test_dynamic_micro_batches_respect_budget_and_restore_order() -> None:
    lengths = [10, 20, 20, 3, 20, 20, 7]
    plan = plan_micro_batches(lengths, micro_batch_size=1, use_dynamic_bsz=True, max_token_len=40)
    assert all(sum(lengths[i] for i in g) <= 40 for g in plan.groups)
    assert len(plan.groups) == math.ceil(sum(lengths) / 40) == 3
    assert sorted(sum(lengths[i] for i in g) for g in plan.groups) == [30, 30, 40]
    stacked = torch.tensor(plan.order, dtype=torch.float32).unsqueeze(-1)  # row i holds its input index
    assert plan.restore(stacked).squeeze(-1).tolist() == list(range(len(lengths)))


def test_micro_batching_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="max_token_len_per_micro_batch=10"):
        plan_micro_batches([11, 3], micro_batch_size=1, use_dynamic_bsz=True, max_token_len=10)
    with pytest.raises(ValueError, match="empty batch"):
        plan_micro_batches([], micro_batch_size=1, use_dynamic_bsz=False, max_token_len=10)


# ------------------------------------------------------------------------------------ packing
def _targets_as_rows(stream) -> torch.Tensor:
    flat = torch.zeros(stream.input_ids.numel(), dtype=torch.long)
    flat[stream.target_index] = stream.labels
    return stream.to_rows(flat)


def test_packed_rows_reset_positions_and_unpack() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    predicted = ids * mask
    predicted[0, 2] = predicted[1, 0] = predicted[2, 0] = 0  # first tokens are never predicted
    stream = make_token_stream(ids, mask, None, remove_padding=True)  # sdpa: rows as long as the longest
    assert stream.input_ids.tolist() == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
    assert stream.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert stream.attention_mask is None
    assert torch.equal(stream.to_rows(stream.input_ids.reshape(-1)), ids * mask)
    assert torch.equal(_targets_as_rows(stream), predicted)
    varlen = make_token_stream(ids, mask, None, remove_padding=True, attn_implementation="flash_attention_2")
    assert varlen.input_ids.shape == (1, 10) and torch.equal(_targets_as_rows(varlen), predicted)
    padded = make_token_stream(ids, mask, None, remove_padding=False)
    assert padded.input_ids is ids and torch.equal(_targets_as_rows(padded), predicted)


@pytest.mark.parametrize("remove_padding", [True, False])
def test_a_widened_stream_keeps_every_token_and_target(remove_padding: bool) -> None:
    """``TokenStream.widened`` (megatron's sequence parallelism): rows padded to a multiple, filler columns a
    document of their own from position 0, the same tokens, targets and rows back."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    stream = make_token_stream(ids, mask, None, remove_padding=remove_padding)
    wide = stream.widened(4)
    rows, width = stream.input_ids.shape
    assert wide.input_ids.shape == (rows, 8) and torch.equal(wide.input_ids[:, :width], stream.input_ids)
    assert wide.position_ids[:, width:].tolist() == [[0, 1, 2]] * rows and not wide.input_ids[:, width:].any()
    assert torch.equal(wide.to_rows(wide.input_ids.reshape(-1)), ids * mask)
    assert torch.equal(_targets_as_rows(wide), _targets_as_rows(stream)) and torch.equal(wide.labels, stream.labels)
    assert stream.widened(5) is stream


@pytest.mark.parametrize("layout", ["padded", "packed", "varlen"])
def test_target_ids_replace_the_predicted_tokens_in_every_layout_and_widening(layout: str) -> None:
    """A batch's ``target_ids`` (Tinker's per-position targets): each predicted position gets its target, the
    stream's input tokens stay the batch's, and the per-slot next tokens (sequence and pipeline parallelism)
    carry the targets too."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    targets = 100 + torch.arange(15).reshape(3, 5)
    options = {"padded": dict(remove_padding=False), "packed": dict(remove_padding=True),
               "varlen": dict(remove_padding=True, attn_implementation="flash_attention_2")}[layout]
    plain = make_token_stream(ids, mask, None, **options)
    stream = make_token_stream(ids, mask, None, target_ids=targets, **options)
    predicted = _targets_as_rows(plain) != 0
    assert torch.equal(stream.input_ids, plain.input_ids)
    assert torch.equal(_targets_as_rows(stream), torch.where(predicted, targets, 0))
    for wide in (stream, stream.widened(4)):
        from_next = torch.zeros(wide.input_ids.numel(), dtype=torch.long)
        from_next[wide.target_index] = wide.next_tokens.reshape(-1)[wide.source_index]
        assert torch.equal(wide.to_rows(from_next), torch.where(predicted, targets, 0))


def test_packed_rows_fill_the_tail_with_a_separate_block() -> None:
    ids = torch.arange(1, 13).reshape(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    stream = make_token_stream(ids, mask, None, remove_padding=True)
    # rows of 4: [seq2], [seq0 + 1 filler], [seq1 + 2 fillers]; fillers restart positions at 0
    assert stream.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]
    assert stream.target_index.tolist() == [1, 2, 3, 5, 6, 9]
    assert torch.equal(stream.to_rows(stream.input_ids.reshape(-1)), ids * mask)


def test_row_width_widens_rows_only_when_the_filler_saved_outweighs_the_attention() -> None:
    similar = [84, 80, 70, 60, 50] * 20  # most longer than half the longest: one per row at width 84
    assert row_width(similar, hidden_size=None) == 84
    assert row_width(similar, hidden_size=512) > 84  # wider rows pair them up
    assert row_width(similar, hidden_size=8) == 84  # attention dear relative to the layers: keep rows short
    assert row_width([84, 20, 20, 20, 20], hidden_size=512) == 84  # already filled at width 84


def test_row_width_finds_the_fit_between_two_multiples_of_the_longest() -> None:
    lengths = [100] + [60] * 40  # two 60s fill a row of 120+, one fills a row of 100, three need 180+
    width = row_width(lengths, hidden_size=512)
    assert 120 <= width < 200

    def slots(width: int) -> int:
        return len(first_fit_rows(lengths, width)) * width

    assert slots(width) < min(slots(multiple * 100) for multiple in (1, 2, 3, 4))  # fewer slots than any multiple


def test_wide_packed_rows_keep_each_sequence_apart() -> None:
    lengths = [7, 4, 4, 4]  # one per row at width 7, all four in one row of 21
    width = max(lengths)
    ids = torch.arange(1, len(lengths) * width + 1).reshape(len(lengths), width)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    narrow = make_token_stream(ids, mask, None, remove_padding=True)
    wide = make_token_stream(ids, mask, None, remove_padding=True, hidden_size=10**6)
    assert wide.input_ids.shape[1] > narrow.input_ids.shape[1] and wide.input_ids.numel() < narrow.input_ids.numel()
    assert torch.equal(wide.to_rows(wide.input_ids.reshape(-1)), ids * mask)
    assert torch.equal(_targets_as_rows(wide), _targets_as_rows(narrow))
    starts = (wide.position_ids.reshape(-1) == 0).sum()  # every sequence and each row's filler restart at 0
    assert starts >= len(lengths)


def test_wide_packed_rows_give_the_padded_log_probs(model_path: Path) -> None:
    """The HF model itself on wide packed rows (several sequences and a filler block per row) against its padded batch."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    forward = MODEL_KIND_REGISTRY.get("causal_lm").forward_cls(model, logprob_chunk_size=64)
    generator = torch.Generator().manual_seed(3)
    lengths = [24, 13, 13, 13, 13]  # one per row at width 24; two rows at width 48
    ids = torch.randint(3, 100, (len(lengths), 24), generator=generator)
    mask = (torch.arange(24)[None, :] >= 24 - torch.tensor(lengths)[:, None]).long()  # left padding
    with torch.no_grad():
        padded = forward(make_token_stream(ids, mask, None, remove_padding=False), 1.0, False)["log_probs"]
        wide_stream = make_token_stream(ids, mask, None, remove_padding=True, hidden_size=10**6)
        wide = forward(wide_stream, 1.0, False)["log_probs"]
    assert wide_stream.input_ids.shape[1] > max(lengths) and wide_stream.input_ids.numel() < ids.numel()
    torch.testing.assert_close(wide, padded, atol=1e-5, rtol=0)
    assert padded.abs().sum() > 0
