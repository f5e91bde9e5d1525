"""In-process unit tests of ``rlflow.engines.common.optim``: LR schedules, AdamW, the optimizer step and the
offload bookkeeping (the per-step AdamW overrides: ``test_step_hyperparams.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_testlib import toy_backward, toy_stepper
from rlflow.engines import EngineConfigError
from rlflow.engines.common.optim.lr_schedulers import LR_SCHEDULE_REGISTRY, LRSchedule, fit_schedule_to_run
from rlflow.engines.common.optim.offload import HOST, HostOffload
from rlflow.engines.common.optim.optimizers import build_adamw, clean_param_name, no_decay_names
from rlflow.engines.config import ADAMW_IMPLEMENTATIONS, EngineConfig, LRSchedulerConfig, OptimizerConfig, config_from_mapping


# -------------------------------------------------------------------------------- LR schedules
def test_warmup_starts_above_zero_and_decays_to_floor() -> None:
    config = LRSchedulerConfig(name="cosine", warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    schedule = LRSchedule(config, base_lr=2.0)
    lrs = []
    for _ in range(16):
        lrs.append(schedule.current_lr())
        schedule.advance()
    assert lrs[:5] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    assert lrs[9] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    assert lrs[14] == pytest.approx(0.2) and lrs[15] == pytest.approx(0.2)
    linear = LRSchedule(LRSchedulerConfig(name="linear", total_steps=10), base_lr=1.0)
    assert [linear.multiplier(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    constant = LRSchedule(LRSchedulerConfig(name="constant", warmup_steps=2), base_lr=1.0)
    assert [constant.multiplier(s) for s in (0, 1, 2, 100)] == [0.5, 1.0, 1.0, 1.0]


def test_a_schedule_is_fitted_to_the_run_before_any_worker_starts() -> None:
    derived = {"name": "cosine", "warmup_steps": 20, "total_steps": 0}  # the SFT default in a 5-step smoke run
    note = fit_schedule_to_run(derived, 5, "engine.lr_scheduler")
    assert derived == {"name": "cosine", "warmup_steps": 4, "total_steps": 5}
    assert note == ("engine.lr_scheduler.warmup_steps=20 does not end within the run's 5 optimizer steps; "
                    "warming up over 4")
    LRSchedule(LRSchedulerConfig(**derived), 1.0)  # the fitted schedule runs
    fits = {"name": "cosine", "warmup_steps": 2, "total_steps": 0}
    assert fit_schedule_to_run(fits, 10, "actor.engine.lr_scheduler") is None and fits["total_steps"] == 10
    constant = {"name": "constant", "warmup_steps": 20, "total_steps": 0}  # no decay: any warmup runs
    assert fit_schedule_to_run(constant, 3, "engine.lr_scheduler") is None and constant["warmup_steps"] == 20
    with pytest.raises(EngineConfigError, match=r"^config key 'actor.engine.lr_scheduler.total_steps': .*must exceed "
                                                r"warmup_steps=8; got total_steps=6; raise it, or set 0"):
        fit_schedule_to_run({"name": "linear", "warmup_steps": 8, "total_steps": 6}, 100, "actor.engine.lr_scheduler")


def test_schedule_errors_and_registry() -> None:
    with pytest.raises(EngineConfigError, match="registered"):
        LRSchedule(LRSchedulerConfig(name="triangle"), 1.0)
    with pytest.raises(EngineConfigError, match="total_steps"):
        LRSchedule(LRSchedulerConfig(name="cosine", warmup_steps=5, total_steps=0), 1.0)
    with LR_SCHEDULE_REGISTRY.temporary():
        @LR_SCHEDULE_REGISTRY.register("half_test", needs_total_steps=False)
        def half(progress: float, floor: float) -> float:
            return 0.5

        assert LRSchedule(LRSchedulerConfig(name="half_test"), 4.0).current_lr() == 2.0

        @LR_SCHEDULE_REGISTRY.register("half_decay_test", needs_total_steps=True)
        def half_decay(progress: float, floor: float) -> float:
            return 0.5

        with pytest.raises(EngineConfigError, match="total_steps"):
            LRSchedule(LRSchedulerConfig(name="half_decay_test"), 4.0)


# ---------------------------------------------------------------------------------- optimizer
def test_adamw_skips_decay_on_biases_and_norms(model_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_path)
    no_decay = no_decay_names(model)
    assert "model.norm.weight" in no_decay and "model.layers.0.self_attn.q_proj.bias" in no_decay
    assert "model.layers.0.self_attn.q_proj.weight" not in no_decay
    optimizer = build_adamw(model.named_parameters(), no_decay, OptimizerConfig(weight_decay=0.1))
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in optimizer.param_groups}
    params = dict(model.named_parameters())
    assert id(params["model.norm.weight"]) in by_decay[0.0]
    assert id(params["model.embed_tokens.weight"]) in by_decay[0.1]
    assert clean_param_name("model._fsdp_wrapped_module.layers.0._fsdp_wrapped_module.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert clean_param_name("module.model.norm.weight") == "model.norm.weight"  # DistributedDataParallel's



@pytest.mark.parametrize("implementation", ADAMW_IMPLEMENTATIONS)
def test_adamw_runs_the_kernels_named_and_steps_like_the_python_loop(implementation: str) -> None:
    """Each ``optimizer.implementation`` selects its AdamW kernels, and 3 steps land within 1e-6 of torch's
    for-loop AdamW on the same gradients (the kernels differ in rounding only)."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    reference.load_state_dict(model.state_dict())
    optimizer = build_adamw(model.named_parameters(), set(), OptimizerConfig(lr=1e-2, implementation=implementation))
    expected = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    assert bool(optimizer.defaults["fused"]) == (implementation == "fused")
    assert bool(optimizer.defaults["foreach"]) == (implementation == "foreach")
    for _ in range(3):
        for net, opt in ((model, optimizer), (reference, expected)):
            net(torch.linspace(-1, 1, 32).view(2, 16)).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for param, ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(param, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(EngineConfigError, match="optimizer.implementation='fast'"):
        config_from_mapping(EngineConfig, {"name": "fsdp2", "optimizer": {"implementation": "fast"}})


# ------------------------------------------------------------------------------ optimizer step
def test_stepper_skips_non_finite_counts_and_still_advances_the_schedule() -> None:
    layer, stepper = toy_stepper()
    before = [p.detach().clone() for p in layer.parameters()]
    toy_backward(layer, float("nan"))
    result = stepper.step()
    assert result["skipped"] and result["skipped_steps"] == 1 and result["lr"] == pytest.approx(0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    assert all(p.grad is None for p in layer.parameters())  # the poisoned gradients are dropped
    toy_backward(layer)
    result = stepper.step()
    assert not result["skipped"] and result["lr"] == pytest.approx(0.075)  # the schedule counted the skip
    assert not all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))


def test_stepper_lr_override_lasts_one_step_and_clip_reports_the_unclipped_norm() -> None:
    layer, stepper = toy_stepper(grad_clip=0.5)
    toy_backward(layer)
    expected_norm = torch.cat([p.grad.flatten() for p in layer.parameters()]).norm().item()
    result = stepper.step(lr=0.0)
    assert result["lr"] == 0.0 and result["grad_norm"] == pytest.approx(expected_norm) and expected_norm > 0.5
    assert stepper.optimizer.param_groups[0]["lr"] == 0.0
    toy_backward(layer)
    assert stepper.step()["lr"] == pytest.approx(0.075)


# ------------------------------------------------------------------------------------ offload
def test_offload_follows_the_flags_and_brings_state_in_for_each_call() -> None:
    """Bookkeeping only: the move callbacks record where they were asked to put things."""
    device = torch.device("cuda", 0)  # a label here: nothing is allocated
    moves: list[tuple[str, torch.device]] = []
    config = EngineConfig(name="x", param_offload=True, optimizer_offload=False)
    offload = HostOffload(device, config, lambda d: moves.append(("params", d)), lambda d: moves.append(("optim", d)))
    assert moves == [("params", HOST)] and offload.params_on_host and not offload.optimizer_on_host
    moves.clear()
    with offload.resident():
        assert moves == [("params", device)]
    assert moves == [("params", device), ("params", HOST)]  # params back to the host, optimizer stays
    moves.clear()
    offload.offload()
    assert offload.params_on_host and offload.optimizer_on_host
    with offload.optimizer_resident():
        pass
    assert moves[-1] == ("optim", device) and offload.optimizer_on_host is False  # optimizer_offload is off
    offload.onload()
    assert not offload.params_on_host and not offload.optimizer_on_host
