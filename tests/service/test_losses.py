"""The Tinker loss registry: every SDK loss name is registered or named as left out, and each loss
equals its published formula, written here in plain PyTorch, in value and gradient."""

from __future__ import annotations

import typing

import pytest
import torch
from tinker.types.loss_fn_type import LossFnType

from loss_references import token_losses

from rlflow.engines import LossContext
from rlflow.protocol import DataProto
from rlflow.service.custom_losses import CUSTOM
from rlflow.service.losses import TINKER_LOSS_REGISTRY, LossInputError, loss_config, make_loss_fn

# SDK names this server does not register, and why (docs/service.md says the same).
LEFT_OUT = {"stable_reinforce": "needs Tinker's unpublished sampling-time stability information"}


def test_every_sdk_loss_name_is_registered_or_named_as_left_out():
    sdk_names = set(typing.get_args(LossFnType))
    assert sdk_names == set(TINKER_LOSS_REGISTRY.names()) | set(LEFT_OUT) | {CUSTOM}  # CUSTOM: an uploaded loss
    assert not set(TINKER_LOSS_REGISTRY.names()) - sdk_names


@pytest.mark.parametrize("name", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"])
@pytest.mark.parametrize("dp_size,micro_batches", [(1, 1), (2, 3)])
def test_loss_is_the_masked_sum_of_its_formula_in_value_and_gradient(name, dp_size, micro_batches):
    torch.manual_seed(0)
    shape = (3, 7)
    lp = (-torch.rand(shape) * 3).requires_grad_()
    mask = (torch.rand(shape) > 0.3).long()
    marked = (torch.rand(shape) > 0.4).float() * mask
    # gspo's clip range is ~1e-3 wide: sampler log-probs near the policy's put some sequences in it and some out
    sampler = lp.detach() - torch.rand(shape) * 0.01 if name == "gspo" else -torch.rand(shape) * 3
    batch = DataProto.from_dict({"loss_mask": mask, "target_weights": torch.rand(shape), "sequence_ratio_mask": marked,
                                 "sampling_logprobs": sampler, "advantages": torch.randn(shape)})
    cfg = loss_config(name, {"clip_low_threshold": 0.998, "clip_high_threshold": 1.008} if name == "gspo" else {})
    if name == "gspo":
        sequence_ratios = [float(torch.exp((lp - sampler)[row][marked[row] != 0].mean())) for row in range(shape[0])]
        assert min(sequence_ratios) < 1.008 < max(sequence_ratios), sequence_ratios  # the clip takes effect somewhere
    ctx = LossContext(global_num_tokens=int(mask.sum()), global_num_seqs=3, dp_size=dp_size,
                      num_micro_batches=micro_batches, micro_batch_index=0)
    loss, metrics = make_loss_fn(name, cfg)({"log_probs": lp}, batch, ctx)
    (grad,) = torch.autograd.grad(loss, lp)

    ref_lp = lp.detach().clone().requires_grad_()
    b = batch.batch
    ref = (token_losses(name, ref_lp, b["sampling_logprobs"], b["advantages"], b["target_weights"], cfg, marked) * mask).sum()
    (ref_grad,) = torch.autograd.grad(ref, ref_lp)
    torch.testing.assert_close(loss / dp_size, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad / dp_size, ref_grad, rtol=1e-6, atol=1e-6)
    # the engine averages metrics over micro-batches, the controller over DP ranks: this gives back the sum
    assert metrics["loss:sum"] == pytest.approx(float(ref.detach()) * dp_size * micro_batches, rel=1e-5)


def test_loss_config_fills_defaults_and_refuses_unknown_keys():
    assert loss_config("ppo", {"clip_high_threshold": 1.5}) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.5}
    with pytest.raises(LossInputError, match="clip_hi.*not read by 'ppo'"):
        loss_config("ppo", {"clip_hi": 1.5})
    with pytest.raises(LossInputError, match="must be numbers, got text"):
        loss_config("ppo", {"clip_high_threshold": "1.5"})
    with pytest.raises(LossInputError, match="unknown loss function 'stable_reinforce'"):
        make_loss_fn("stable_reinforce", {})
