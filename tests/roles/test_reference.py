"""``Reference``: the frozen reference policy on a real engine in this process. Its ``ref_log_prob`` is the HF
model's temperature-scaled log-prob of each response token (zero on padding), and an empty batch gives an empty one."""

from __future__ import annotations

import pytest
from roles_testlib import TEMPERATURE, assert_response_close, engine_params, hf_response_log_probs, role_config, token_batch

from rlflow.roles.reference import Reference


@pytest.fixture(scope="module", params=engine_params())
def reference(request, models, worker_env) -> Reference:
    config = role_config(models.causal, request.param)
    return Reference(config.ref, str(models.causal))


def test_ref_log_prob_is_the_hf_models_log_prob_of_each_response_token(reference, models, hf_causal):
    data = token_batch(3, models.vocab)
    data.meta_info["temperature"] = TEMPERATURE
    out = reference.compute_ref_log_prob(data)
    expected, _ = hf_response_log_probs(hf_causal, data, TEMPERATURE)
    assert set(out.batch) == {"ref_log_prob"}
    assert_response_close(out.batch["ref_log_prob"], expected, data.batch["response_mask"])


def test_an_empty_batch_gives_an_empty_ref_log_prob(reference, models):
    out = reference.compute_ref_log_prob(token_batch(3, models.vocab)[0:0])
    assert out.batch["ref_log_prob"].shape == (0, 6)
