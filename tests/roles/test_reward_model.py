"""``RewardModel``: a value-head model's score of each sequence, on a real engine in this process. ``rm_scores``
holds the HF score head's output at each row's last response token and zeros elsewhere; an empty batch
gives empty scores."""

from __future__ import annotations

import pytest
import torch
from roles_testlib import ATOL, engine_params, hf_token_scores, prompt_lengths, role_config, token_batch

from rlflow.engines.base import Capability
from rlflow.roles.reward_model import RewardModel, last_token_scores


@pytest.fixture(scope="module", params=engine_params(Capability.VALUE_MODEL))
def reward_model(request, models, worker_env) -> RewardModel:
    config = role_config(models.causal, request.param)
    return RewardModel(config.reward.reward_model, str(models.value))


def test_rm_scores_are_the_hf_score_at_each_rows_last_response_token(reward_model, models, hf_value):
    data = token_batch(4, models.vocab)
    scores = reward_model.compute_rm_score(data).batch["rm_scores"]
    lengths = data.batch["response_mask"].sum(-1).long().tolist()
    expected = torch.zeros_like(scores)
    for row, (row_scores, prompt_length) in enumerate(zip(hf_token_scores(hf_value, data), prompt_lengths(data))):
        expected[row, lengths[row] - 1] = row_scores[prompt_length + lengths[row] - 1]
    torch.testing.assert_close(scores, expected, atol=ATOL, rtol=0)
    assert (scores != 0).sum() == len(lengths), "one score per row"


def test_an_empty_batch_gives_empty_scores(reward_model, models):
    assert reward_model.compute_rm_score(token_batch(4, models.vocab)[0:0]).batch["rm_scores"].shape == (0, 6)


def test_a_row_without_response_tokens_scores_zero():
    per_token = torch.arange(1.0, 7.0).reshape(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert last_token_scores(per_token, mask).tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
