"""``SFTWorker``: one engine rank of supervised fine-tuning, on a real engine in this process. ``evaluate`` is the
HF model's token-mean negative log-likelihood of the ``loss_mask`` tokens, a step on a batch lowers it, and
an empty batch fails in one line."""

from __future__ import annotations

import pytest
import torch
from roles_testlib import engine_params, hf_response_log_probs, role_config, token_batch

from rlflow.protocol import DataProto
from rlflow.roles.sft_worker import SFTWorker


def sft_batch(seed: int, vocab: int) -> DataProto:
    """The RL token batch as an SFT batch: the loss covers the response tokens."""
    data = token_batch(seed, vocab)
    mask = data.batch["response_mask"]
    loss_mask = torch.cat([torch.zeros(len(data), data.batch["input_ids"].shape[1] - mask.shape[1]), mask], dim=1)
    return DataProto.from_dict({**{key: data.batch[key] for key in ("input_ids", "attention_mask", "position_ids")},
                                "loss_mask": loss_mask})


@pytest.fixture(scope="module", params=engine_params())
def worker(request, models, worker_env) -> SFTWorker:
    engine = role_config(models.causal, request.param).actor.engine
    return SFTWorker(engine, str(models.causal))


def test_evaluate_is_the_hf_nll_and_a_step_lowers_it(worker, models, hf_causal):
    data = sft_batch(7, models.vocab)
    rl_view = token_batch(7, models.vocab)
    log_probs, _ = hf_response_log_probs(hf_causal, rl_view, 1.0)
    mask = rl_view.batch["response_mask"]
    expected = float(-(log_probs * mask).sum() / mask.sum())
    before = worker.evaluate(data)["loss"]
    assert before == pytest.approx(expected, abs=1e-5)
    worker.forward_backward(data)
    worker.optim_step()
    assert worker.evaluate(data)["loss"] < before - 1e-3


def test_an_empty_batch_fails_in_one_line(worker, models):
    empty = sft_batch(7, models.vocab)[0:0]
    for method in ("forward_backward", "evaluate"):
        with pytest.raises(ValueError, match=rf"SFTWorker.{method} got an empty batch \(0 rows\)"):
            getattr(worker, method)(empty)
