"""Tinker data as engine batches (``rlflow.service.batches``): where targets go, and the tokens a datum may hold."""

from __future__ import annotations

import pytest
import torch

from rlflow.service.batches import Datum, training_batch
from rlflow.service.losses import LossInputError

VOCAB = 40


def _datum(tokens: list[int], targets: list[int]) -> Datum:
    return Datum(tokens, {"target_tokens": targets})


def test_next_token_data_carry_no_target_ids_and_score_the_row_itself():
    batch = training_batch([_datum([1, 2, 3], [2, 3, 4]), _datum([5, 6], [6, 7])], {}, pad_token_id=0, max_len=16,
                           vocab_size=VOCAB)
    assert "target_ids" not in batch.batch
    assert batch.batch["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 0]]
    assert batch.batch["loss_mask"].tolist() == [[0, 1, 1, 1], [0, 1, 1, 0]]


def test_other_targets_go_to_the_engine_as_target_ids_in_the_scored_columns():
    """tinker-cookbook's rl_loop: 0 at the prompt's positions. Column t + 1 scores target t; a batch with one such
    datum gives every row its targets (next-token rows their own next tokens)."""
    batch = training_batch([_datum([1, 2, 3], [0, 0, 9]), _datum([5, 6], [6, 7])], {}, pad_token_id=0, max_len=16,
                           vocab_size=VOCAB)
    assert batch.batch["input_ids"].tolist() == [[1, 2, 3, 9], [5, 6, 7, 0]]
    assert batch.batch["target_ids"].tolist() == [[1, 0, 0, 9], [5, 6, 7, 0]]
    assert batch.batch["target_ids"].dtype == torch.long


@pytest.mark.parametrize("tokens,targets,message", [
    ([1, VOCAB, 3], [VOCAB, 3, 4], f"datum 0: model_input: token {VOCAB} at position 1 is outside the model's "
                                   f"vocabulary 0..{VOCAB - 1}"),
    ([1, 2, 3], [0, -1, 4], f"datum 0: target_tokens: token -1 at position 1 is outside the model's vocabulary"),
])
def test_a_token_outside_the_vocabulary_is_refused_naming_datum_and_position(tokens, targets, message):
    with pytest.raises(LossInputError, match=message):
        training_batch([_datum(tokens, targets)], {}, pad_token_id=0, max_len=16, vocab_size=VOCAB)
