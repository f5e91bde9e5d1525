"""In-process unit tests of the chunked log-prob head (``rlflow.engines.common.forward.logprob``)."""

from __future__ import annotations

import pytest
import torch

from rlflow.engines.common.forward.logprob import chunked_log_probs


# ---------------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chunked_log_probs_match_full_softmax(chunk_size: int) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(7, 8, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    log_probs, entropy = chunked_log_probs(
        hidden, head, labels, temperature=0.7, chunk_size=chunk_size, compute_entropy=True
    )
    (log_probs.sum() + entropy.sum()).backward()
    grads = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    full = torch.log_softmax(head(hidden) / 0.7, dim=-1)
    expected_lp = full.gather(-1, labels[:, None]).squeeze(-1)
    expected_ent = -(full.exp() * full).sum(-1)
    (expected_lp.sum() + expected_ent.sum()).backward()
    torch.testing.assert_close(log_probs, expected_lp)
    torch.testing.assert_close(entropy, expected_ent)
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], head.weight.grad)


def test_log_probs_reject_bad_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        chunked_log_probs(torch.zeros(2, 3), torch.nn.Identity(), torch.zeros(2, dtype=torch.long), temperature=0.0)
