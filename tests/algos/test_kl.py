"""KL estimators, straight-through '+' variants, KL-in-reward and the KL controllers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_rewards,
    get_kl_controller,
    kl_estimator_names,
    kl_penalty,
)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plain_estimate(name: str, logprob: float, ref_logprob: float) -> float:
    """Scalar formulas written out per estimator name (aliases spelled out)."""
    d = logprob - ref_logprob
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return abs(d)
    if name in ("mse", "k2"):
        return d * d / 2
    x = min(max(-d, -20.0), 20.0)  # low_var_kl / k3
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


ESTIMATORS = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


def test_every_name_is_registered():
    assert set(kl_estimator_names()) == set(ESTIMATORS) | {"full"}


def test_hand_computed_values():
    logprob, ref = torch.tensor([-1.0]), torch.tensor([-1.5])  # d = 0.5
    expected = {"k1": 0.5, "abs": 0.5, "k2": 0.125, "k3": math.exp(-0.5) + 0.5 - 1}
    for name, value in expected.items():
        assert kl_penalty(logprob, ref, name).item() == pytest.approx(value, rel=1e-6)
        assert kl_penalty(logprob, ref, name + "+").item() == pytest.approx(value, rel=1e-6)


def test_low_var_kl_is_clamped_like_verl():
    logprob = torch.tensor([0.0, -30.0, 0.0], dtype=torch.float64)
    ref = torch.tensor([-30.0, 0.0, -1e-3], dtype=torch.float64)
    out = kl_penalty(logprob, ref, "low_var_kl")
    assert out[0].item() == 10.0  # exp(-20) + 20 - 1 = 19 -> clamped to 10
    assert out[1].item() == 10.0  # exp(20) - 21 -> clamped to 10
    assert out[2].item() == pytest.approx(math.exp(-1e-3) + 1e-3 - 1, abs=1e-9)


@FAST
@given(
    st.lists(st.tuples(st.floats(-40, 0, allow_nan=False), st.floats(-40, 0, allow_nan=False)), min_size=1, max_size=8),
    st.sampled_from(ESTIMATORS),
)
def test_matches_scalar_formulas(pairs, name):
    logprob = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    expected = torch.tensor([plain_estimate(name, p, r) for p, r in pairs], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(logprob, ref, name), expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(kl_penalty(logprob, ref, name + "+"), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["kl", "abs", "mse", "low_var_kl"])
def test_gradcheck_plain_estimators(name):
    logprob = torch.tensor([-1.0, -0.2, -2.5, -0.7], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.3, -0.9, -2.0, -0.1], dtype=torch.float64, requires_grad=True)  # d != 0 for abs
    assert torch.autograd.gradcheck(lambda p, q: kl_penalty(p, q, name), (logprob, ref))


@pytest.mark.parametrize("name", ["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"])
def test_gradcheck_straight_through_variants(name):
    """``name+`` must back-propagate exactly the k2 gradient. Adding the detached constant
    ``k2 - name`` (plain formulas, computed independently) makes the forward value equal to k2
    without touching the graph, so gradcheck compares the '+' backward with finite
    differences of k2 in float64."""
    logprob = torch.tensor([-1.0, -0.2, -2.5, -0.7, -3.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.3, -0.9, -2.0, -0.1, -0.5], dtype=torch.float64, requires_grad=True)

    def k2_valued(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        offset = [plain_estimate("k2", a, b) - plain_estimate(name, a, b) for a, b in zip(p.tolist(), q.tolist())]
        return kl_penalty(p, q, name + "+") + torch.tensor(offset, dtype=torch.float64)

    assert torch.autograd.gradcheck(k2_valued, (logprob, ref))
    grad_logprob, grad_ref = torch.autograd.grad(kl_penalty(logprob, ref, name + "+").sum(), (logprob, ref))
    torch.testing.assert_close(grad_logprob, (logprob - ref).detach())
    torch.testing.assert_close(grad_ref, (ref - logprob).detach())


def test_plain_and_straight_through_gradients_differ_for_k3():
    logprob = torch.tensor([-0.2], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.5], dtype=torch.float64)
    (plain,) = torch.autograd.grad(kl_penalty(logprob, ref, "k3").sum(), logprob)
    (straight,) = torch.autograd.grad(kl_penalty(logprob, ref, "k3+").sum(), logprob)
    assert plain.item() == pytest.approx(1 - math.exp(-1.3))  # d/dp of exp(q - p) + p - q - 1
    assert straight.item() == pytest.approx(1.3)


def test_full_is_refused_with_alternatives():
    with pytest.raises(NotImplementedError) as error:
        kl_penalty(torch.zeros(2), torch.zeros(2), "full")
    for alternative in ("k1", "k2", "low_var_kl", "k3", "+"):
        assert alternative in str(error.value)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as error:
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    assert "low_var_kl" in str(error.value) and "algorithm.kl_penalty" in str(error.value)
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(torch.zeros(2), torch.zeros(3), "k1")


def test_compute_rewards_hand_computed():
    scores = torch.tensor([[0.0, 1.0]])
    rewards = compute_rewards(scores, torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), kl_ratio=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.1]]))


def test_apply_kl_penalty_masks_updates_controller_and_reports():
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -2.0, -9.0], [-1.0, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    controller = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=10)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, controller, "kl")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 0.8, 0.0], [0.0, 0.0, 0.0]]))
    # per-sequence KL: (0.5 + 1) / 2 = 0.75 and 0 -> batch mean 0.375
    assert metrics == pytest.approx({"actor/reward_kl_penalty": 0.375, "actor/reward_kl_penalty_coeff": 0.2})
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 2 / 10))  # error clipped to +0.2, n_steps = 2


def test_controllers_hand_computed():
    fixed = FixedKLController(kl_coef=0.05)
    fixed.update(current_kl=10.0, n_steps=100)
    assert fixed.value == 0.05
    adaptive = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    adaptive.update(current_kl=0.1, n_steps=10)  # error clip(1.0) = 0.2
    assert adaptive.value == pytest.approx(0.1 * 1.02)
    adaptive.update(current_kl=0.045, n_steps=10)  # error -0.1
    assert adaptive.value == pytest.approx(0.1 * 1.02 * 0.99)


def test_get_kl_controller_from_config():
    fixed = get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.01, target_kl=0.1, horizon=10000))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.01
    adaptive = get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.02, target_kl=0.1, horizon=500))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.horizon == 500
    with pytest.raises(ValueError, match="algorithm.kl_ctrl.type"):
        get_kl_controller(SimpleNamespace(type="pid", kl_coef=0.01))
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.02, target_kl=0.1, horizon=0))
