"""Per-step AdamW settings (``optim_step(lr, StepHyperparams)``, the Tinker service's AdamParams) against a plain
``torch.optim.AdamW`` built with those settings, with the gradient clipped by ``clip_grad_norm_``."""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlflow.engines.common.optim.optimizer_step import OptimizerStepper
from rlflow.engines.common.optim.optimizers import build_adamw, no_decay_names
from rlflow.engines.config import EngineConfig, OptimizerConfig, StepHyperparams


def _grads(model: nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    model.zero_grad()
    (model(torch.randn(4, 6)) ** 2).sum().backward()


def test_step_hyperparams_replace_the_configured_adamw_settings_for_that_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    reference = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    reference.load_state_dict(model.state_dict())
    config = EngineConfig()  # betas (0.9, 0.999), eps 1e-8, weight decay 0.01, clip 1.0: all replaced below
    stepper = OptimizerStepper(build_adamw(model.named_parameters(), no_decay_names(model), config.optimizer), config,
                               lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    hyperparams = StepHyperparams(betas=(0.5, 0.9), eps=1e-3, weight_decay=0.2, grad_clip=0.05)
    decay = [p for n, p in reference.named_parameters() if p.ndim >= 2]
    plain = torch.optim.AdamW([{"params": decay, "weight_decay": 0.2},
                               {"params": [p for p in reference.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                              lr=0.03, betas=(0.5, 0.9), eps=1e-3)
    for step in range(3):
        _grads(model, step)
        _grads(reference, step)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        stepper.step(0.03, hyperparams)
        plain.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
    unclipped = StepHyperparams(grad_clip=0.0)  # 0 measures the norm without clipping (Tinker's grad_clip_norm=0)
    _grads(model, 9)
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    assert stepper.step(0.03, unclipped)["grad_norm"] == norm > 0.05


def test_a_loaded_optimizer_state_keeps_the_configured_kernels():
    """Loading a state dict brings the saved run's AdamW kernels along; the stepper's load puts the configured
    ones back (and the ``step`` counters where they keep them), and the next step matches a plain AdamW."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    saved_run = torch.optim.AdamW(model.parameters(), lr=0.03, fused=True)
    _grads(model, 0)
    saved_run.step()
    reference = nn.Linear(6, 3)
    reference.load_state_dict(model.state_dict())
    plain = torch.optim.AdamW(reference.parameters(), lr=0.03, foreach=False)
    plain.load_state_dict(copy.deepcopy(saved_run.state_dict()))  # a load keeps the given tensors: no sharing
    config = EngineConfig(name="x", optimizer=OptimizerConfig(lr=0.03, weight_decay=0.01, implementation="for-loop"))
    stepper = OptimizerStepper(build_adamw(model.named_parameters(), set(), config.optimizer), config,
                               lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    stepper.optimizer.load_state_dict(copy.deepcopy(saved_run.state_dict()))  # as an engine's checkpoint load does
    assert stepper.optimizer.param_groups[0]["fused"], "torch takes the saved run's kernels"
    stepper.load_state_dict(stepper.state_dict())
    group = stepper.optimizer.param_groups[0]
    assert (group["fused"], group["foreach"]) == (None, False)
    assert all(stepper.optimizer.state[p]["step"].device.type == "cpu" for p in model.parameters())
    _grads(model, 1)
    _grads(reference, 1)
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    stepper.step()
    plain.param_groups[0].update(fused=None, foreach=False)
    plain.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)



def test_a_reset_stepper_steps_like_a_new_adamw_from_the_same_weights():
    """``reset`` (the service's ``load_state`` without the optimizer) forgets the moments and step counts: the
    next step equals a new ``torch.optim.AdamW``'s first step from the same weights."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    config = EngineConfig(optimizer=OptimizerConfig(weight_decay=0.0))
    stepper = OptimizerStepper(build_adamw(model.named_parameters(), set(), config.optimizer), config,
                               lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    for step in range(2):
        _grads(model, step)
        stepper.step(0.03, StepHyperparams(grad_clip=0.0))
    reference = nn.Linear(6, 3)
    reference.load_state_dict(model.state_dict())
    stepper.reset()
    _grads(model, 5)
    stepper.step(0.03, StepHyperparams(grad_clip=0.0))
    _grads(reference, 5)
    torch.optim.AdamW(reference.parameters(), lr=0.03, betas=config.optimizer.betas, eps=config.optimizer.eps,
                      weight_decay=0.0).step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
