"""``Reference``: the frozen reference policy on a real engine in this process. Its ``ref_log_prob`` is the HF
model's temperature-scaled log-prob of each response token (zero on padding), and an empty batch gives an empty one."""

from __future__ import annotations

import pytest
import torch
from roles_testlib import ATOL, TEMPERATURE, engine_params, hf_response_log_probs, role_config, token_batch

from rlflow.roles.reference import Reference


@pytest.fixture(scope="module", params=engine_params())
def reference(request, models, worker_env) -> Reference:
    config = role_config(models.causal, f"ref.engine={request.param}")
    return Reference(config.ref, str(models.causal))


def test_ref_log_prob_is_the_hf_models_log_prob_of_each_response_token(reference, models, hf_causal):
    data = token_batch(3, models.vocab)
    data.meta_info["temperature"] = TEMPERATURE
    out = reference.compute_ref_log_prob(data)
    expected, _ = hf_response_log_probs(hf_causal, data, TEMPERATURE)
    mask = data.batch["response_mask"].bool()
    assert set(out.batch) == {"ref_log_prob"}
    torch.testing.assert_close(out.batch["ref_log_prob"][mask], expected[mask], atol=ATOL, rtol=0)
    assert not out.batch["ref_log_prob"][~mask].any()


def test_an_empty_batch_gives_an_empty_ref_log_prob(reference, models):
    out = reference.compute_ref_log_prob(token_batch(3, models.vocab)[0:0])
    assert out.batch["ref_log_prob"].shape == (0, 6)
