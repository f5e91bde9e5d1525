"""Policy losses: hand-computed clip cases, per-token loop references, gradients, config handling."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from rlflow.algos import (
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_policy_loss,
    get_policy_loss_fn,
)

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]
LOSS_NAMES = ["vanilla", "gspo", "cispo", "sapo", "geo_mean", "gpg", "clip_cov", "kl_cov"]


def make_config(low=0.2, high=0.28, c=3.0, **policy_loss) -> SimpleNamespace:
    defaults = dict(clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002, ppo_kl_coef=1.0)
    return SimpleNamespace(
        clip_ratio=0.2,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        tau_pos=1.0,
        tau_neg=1.05,
        policy_loss=SimpleNamespace(**{**defaults, **policy_loss}),
    )


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


# ---------------------------------------------------------------- per-token loop references
def ref_vanilla_tokens(old, new, adv, low, high, c):
    out, clipped, dual = [], [], []
    for old_row, new_row, adv_row in zip(old, new, adv):
        row, row_clipped, row_dual = [], [], []
        for o, n, a in zip(old_row, new_row, adv_row):
            ratio = math.exp(_clip(n - o, -20.0, 20.0))
            plain, bounded = -a * ratio, -a * _clip(ratio, 1 - low, 1 + high)
            value = max(plain, bounded)
            row_clipped.append(bounded > plain)
            row_dual.append(a < 0 and value > -a * c)
            if a < 0:
                value = min(value, -a * c)
            row.append(value)
        out.append(row)
        clipped.append(row_clipped)
        dual.append(row_dual)
    return out, clipped, dual


def ref_gspo_tokens(old, new, adv, mask, low, high):
    out = []
    for old_row, new_row, adv_row, mask_row in zip(old, new, adv, mask):
        kept = [n - o for o, n, m in zip(old_row, new_row, mask_row) if m]
        seq_ratio = math.exp(min(sum(kept) / max(len(kept), 1), 10.0))
        out.append([max(-a * seq_ratio, -a * _clip(seq_ratio, 1 - low, 1 + high)) for a in adv_row])
    return out


def ref_sapo_tokens(old, new, adv, tau_pos, tau_neg):
    out = []
    for old_row, new_row, adv_row in zip(old, new, adv):
        row = []
        for o, n, a in zip(old_row, new_row, adv_row):
            ratio = math.exp(_clip(n - o, -20.0, 20.0))
            tau = tau_pos if a > 0 else tau_neg
            row.append(-a * (4.0 / tau) / (1.0 + math.exp(-tau * (ratio - 1.0))))
        out.append(row)
    return out


def ref_cispo_tokens(old, new, adv, low, high):
    return [
        [-_clip(math.exp(_clip(n - o, -20.0, 20.0)), 1 - low, 1 + high) * a * n for o, n, a in zip(*rows)]
        for rows in zip(old, new, adv)
    ]


def ref_geo_mean(old, new, adv, mask, low, high):
    """Mean over the non-empty sequences of -mean(A) * geometric-mean clipped ratio."""
    losses = []
    for old_row, new_row, adv_row, mask_row in zip(old, new, adv, mask):
        if not any(mask_row):
            continue
        n_kept, log_sum, adv_sum = 0, 0.0, 0.0
        for o, n, a, m in zip(old_row, new_row, adv_row, mask_row):
            if not m:
                continue
            d = n - o
            # pessimistic per-token log-ratio: the clipped one when it lowers the objective
            log_sum += min(d, _clip(d, -low, high)) if a > 0 else max(d, _clip(d, -low, high)) if a < 0 else 0.0
            adv_sum += a
            n_kept += 1
        losses.append(-(adv_sum / n_kept) * math.exp(log_sum / n_kept))
    return sum(losses) / len(losses) if losses else 0.0


def ref_kl_cov_tokens(old, new, adv, mask, ratio, coef):
    cells = [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]
    out = [[-a * math.exp(n - o) for o, n, a in zip(*rows)] for rows in zip(old, new, adv)]
    if not cells:
        return out, True
    mean_adv = sum(adv[i][t] for i, t in cells) / len(cells)
    mean_logp = sum(new[i][t] for i, t in cells) / len(cells)
    cov = {cell: (adv[cell[0]][cell[1]] - mean_adv) * (new[cell[0]][cell[1]] - mean_logp) for cell in cells}
    ranked = sorted(cells, key=lambda cell: cov[cell], reverse=True)
    k = max(1, int(len(cells) * ratio))
    unambiguous = k == len(ranked) or cov[ranked[k - 1]] != cov[ranked[k]]
    for i, t in ranked[:k]:
        out[i][t] += coef * abs(new[i][t] - old[i][t])
    return out, unambiguous


# ---------------------------------------------------------------- strategies
@st.composite
def policy_batches(draw, max_rows: int = 5, max_cols: int = 5):
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    floats = st.floats(-4, 0, allow_nan=False, width=32)
    old = [[draw(floats) for _ in range(cols)] for _ in range(rows)]
    # log-ratios mostly near 0, sometimes far outside any clip range (and past the +-20 clamp)
    shift = st.one_of(st.floats(-0.5, 0.5, allow_nan=False, width=32), st.sampled_from([-30.0, -3.0, 3.0, 30.0]))
    new = [[o + draw(shift) for o in row] for row in old]
    adv = [[draw(st.floats(-3, 3, allow_nan=False, width=32)) for _ in range(cols)] for _ in range(rows)]
    mask = [[draw(st.integers(0, 1)) for _ in range(cols)] for _ in range(rows)]
    return old, new, adv, mask


clip_params = st.tuples(st.floats(0.05, 0.5), st.floats(0.05, 0.5), st.floats(1.5, 5.0))


# ---------------------------------------------------------------- hand-computed PPO clip cases
def test_ppo_both_clip_bounds_dual_clip_and_log_ratio_clamp_hand_computed():
    advantages = _t([[1.0, -1.0, -1.0, 1.0, -2.0, 1.0]])
    log_ratio = _t([[math.log(2.0), math.log(0.5), math.log(10.0), 50.0, -3.0, 0.0]])
    old = torch.full_like(log_ratio, -1.0)
    new = (old + log_ratio).requires_grad_(True)
    mask = torch.ones_like(old)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        old, new, advantages, mask, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0
    )
    # token losses: upper clip -1.28 | lower clip 0.8 | dual clip 3 | log-ratio clamped to 20, upper clip -1.28 |
    #               lower clip 2*0.8 | unclipped -1
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 3.0 - 1.28 + 1.6 - 1.0) / 6)
    assert clipfrac.item() == pytest.approx(4 / 6)
    assert clipfrac_lower.item() == pytest.approx(1 / 6)
    assert ppo_kl.item() == pytest.approx(-(math.log(2) + math.log(0.5) + math.log(10) + 20 - 3) / 6)
    loss.backward()
    # only the unclipped token carries a gradient: d(-A r)/d log_prob = -A r = -1, over 6 tokens
    torch.testing.assert_close(new.grad, _t([[0, 0, 0, 0, 0, -1 / 6]]))


def test_vanilla_registry_uses_config_keys_and_defaults():
    old, new = torch.zeros(1, 2), _t([[math.log(2.0), math.log(10.0)]]).float()
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-sum", SimpleNamespace(clip_ratio=0.2))
    # clip_ratio_low/high fall back to clip_ratio (upper bound 1.2); clip_ratio_c defaults to 3
    assert loss.item() == pytest.approx(-1.2 + 3.0)
    expected = {"actor/pg_clipfrac": 0.5, "actor/ppo_kl": -math.log(20) / 2, "actor/pg_clipfrac_lower": 0.5}
    assert metrics == pytest.approx(expected)


# ---------------------------------------------------------------- loop references on random inputs
@FAST
@given(policy_batches(), clip_params, st.sampled_from(MODES))
def test_vanilla_matches_reference(batch, params, mode):
    old, new, adv, mask = batch
    low, high, c = params
    expected, clipped, dual = ref_vanilla_tokens(old, new, adv, low, high, c)
    mask_t = _t(mask)
    loss, metrics = get_policy_loss_fn("vanilla")(_t(old), _t(new), _t(adv), mask_t, mode, make_config(low, high, c))
    torch.testing.assert_close(loss, agg_loss(_t(expected), mask_t, mode), rtol=1e-9, atol=1e-9)
    n_kept = max(sum(map(sum, mask)), 1)
    frac = lambda flags: sum(f and m for fr, mr in zip(flags, mask) for f, m in zip(fr, mr)) / n_kept  # noqa: E731
    assert metrics["actor/pg_clipfrac"] == pytest.approx(frac(clipped))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(frac(dual))
    functional = compute_policy_loss(_t(old), _t(new), _t(adv), mask_t, None, low, high, c, mode)
    assert functional[0].item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-12)


@FAST
@given(policy_batches(), clip_params)
def test_sequence_level_losses_match_references(batch, params):
    old, new, adv, mask = batch
    low, high, _ = params
    config = make_config(low, high)
    args = (_t(old), _t(new), _t(adv), _t(mask))
    seq_mode = "seq-mean-token-mean"  # sapo always aggregates this way (verl 0.9.1)
    for mode in (seq_mode, "token-mean"):
        gspo, _ = get_policy_loss_fn("gspo")(*args, mode, config)
        expected_gspo = agg_loss(_t(ref_gspo_tokens(old, new, adv, mask, low, high)), _t(mask), mode)
        torch.testing.assert_close(gspo, expected_gspo, rtol=1e-9, atol=1e-9)
    sapo, _ = get_policy_loss_fn("sapo")(*args, "token-sum", config)
    expected_sapo = agg_loss(_t(ref_sapo_tokens(old, new, adv, 1.0, 1.05)), _t(mask), seq_mode)
    torch.testing.assert_close(sapo, expected_sapo, rtol=1e-9, atol=1e-9)
    geo, _ = get_policy_loss_fn("geo_mean")(*args, "token-mean", config)
    assert geo.item() == pytest.approx(ref_geo_mean(old, new, adv, mask, low, high), rel=1e-9, abs=1e-9)


@FAST
@given(policy_batches(), clip_params, st.sampled_from(MODES))
def test_token_level_losses_match_references(batch, params, mode):
    old, new, adv, mask = batch
    low, high, _ = params
    config = make_config(low, high)
    args = (_t(old), _t(new), _t(adv), _t(mask))
    cispo, _ = get_policy_loss_fn("cispo")(*args, mode, config)
    torch.testing.assert_close(cispo, agg_loss(_t(ref_cispo_tokens(old, new, adv, low, high)), _t(mask), mode))
    gpg, _ = get_policy_loss_fn("gpg")(*args, mode, config)
    expected_gpg = [[-a * n for n, a in zip(nr, ar)] for nr, ar in zip(new, adv)]
    torch.testing.assert_close(gpg, agg_loss(_t(expected_gpg), _t(mask), mode))


@FAST
@given(policy_batches(), st.floats(0.05, 1.0), st.floats(0.1, 2.0))
def test_kl_cov_matches_reference(batch, cov_ratio, coef):
    old, new, adv, mask = batch
    old = [[o for o in row] for row in old]
    new = [[o + _clip(n - o, -3, 3) for o, n in zip(orow, nrow)] for orow, nrow in zip(old, new)]  # keep exp finite
    expected, unambiguous = ref_kl_cov_tokens(old, new, adv, mask, cov_ratio, coef)
    assume(unambiguous)  # a tie at the top-k boundary makes the selected token set arbitrary
    config = make_config(kl_cov_ratio=cov_ratio, ppo_kl_coef=coef)
    loss, _ = get_policy_loss_fn("kl_cov")(_t(old), _t(new), _t(adv), _t(mask), "token-mean", config)
    torch.testing.assert_close(loss, agg_loss(_t(expected), _t(mask), "token-mean"), rtol=1e-9, atol=1e-9)


def test_clip_cov_detaches_candidate_tokens():
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = _t([[0.1, 0.0, 0.0, 0.0]])
    adv = _t([[3.0, -1.0, -1.0, -1.0]])
    # mean A = 0, mean log_prob = 0.025: cov = 0.225 for token 0 (inside (0.2, 5), ratio e^0.1 unclipped)
    # and 0.025 for the others, so token 0 is the only candidate
    config = make_config(clip_cov_ratio=1.0, clip_cov_lb=0.2, clip_cov_ub=5.0)
    log_prob = new.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn("clip_cov")(old, log_prob, adv, torch.ones_like(old), "token-mean", config)
    loss.backward()
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    assert log_prob.grad[0, 0].item() == 0.0 and (log_prob.grad[0, 1:] != 0).all()
    assert loss.item() == pytest.approx((0 + 1 + 1 + 1) / 4)  # token 0 contributes 0, others -A * 1


def test_clip_cov_detaches_at_most_the_configured_share():
    torch.manual_seed(0)
    old = torch.zeros(4, 50, dtype=torch.float64)
    new = 0.05 * torch.randn(4, 50, dtype=torch.float64)
    adv = torch.randn(4, 50, dtype=torch.float64) * 5
    config = make_config(clip_cov_ratio=0.02, clip_cov_lb=-100.0, clip_cov_ub=100.0)
    _, metrics = get_policy_loss_fn("clip_cov")(old, new, adv, torch.ones_like(old), "token-mean", config)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(int(0.02 * 200) / 200)


# ---------------------------------------------------------------- gradient checks (float64)
def _grad_inputs(rows=3, sequence_advantages=False):
    old = _t([[-1.0, -2.0, -0.5, -1.5], [-0.3, -1.2, -2.2, -0.7], [-1.1, -0.4, -0.9, -2.5]])[:rows]
    # log-ratios away from every kink: in band (+-0.05..0.1), beyond both bounds (+-0.5..2) and the dual clip
    log_ratio = _t([[0.05, 2.0, -1.0, 0.5], [-0.1, 0.6, 1.5, -0.7], [0.08, -0.9, 0.3, 2.5]])[:rows]
    if sequence_advantages:
        adv = _t([[1.3] * 4, [-0.8] * 4, [0.6] * 4])[:rows]
    else:
        adv = _t([[1.3, -0.8, 0.6, -1.7], [-0.5, 1.1, -2.0, 0.9], [0.7, -1.4, 1.8, -0.6]])[:rows]
    mask = _t([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])[:rows]
    return old, (old + log_ratio), adv, mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradcheck_vanilla_and_functional_ppo(mode):
    old, new, adv, mask = _grad_inputs()
    inputs = tuple(x.clone().requires_grad_(True) for x in (old, new, adv))
    vanilla = get_policy_loss_fn("vanilla")
    assert torch.autograd.gradcheck(lambda o, n, a: vanilla(o, n, a, mask, mode, make_config())[0], inputs)
    assert torch.autograd.gradcheck(
        lambda o, n, a: compute_policy_loss(o, n, a, mask, 0.2, None, 0.28, 3.0, mode)[0], inputs
    )


@pytest.mark.parametrize("name", ["sapo", "geo_mean", "gpg", "kl_cov", "clip_cov"])
def test_gradcheck_smooth_losses(name):
    old, new, adv, mask = _grad_inputs(sequence_advantages=name == "geo_mean")
    config = make_config(kl_cov_ratio=0.3, clip_cov_ratio=1.0, clip_cov_lb=0.2, clip_cov_ub=5.0)
    fn = get_policy_loss_fn(name)
    inputs = tuple(x.clone().requires_grad_(True) for x in (new, adv))
    assert torch.autograd.gradcheck(lambda n, a: fn(old, n, a, mask, "token-mean", config)[0], inputs)


def test_gradcheck_gspo_with_sequence_advantages():
    """With one advantage per sequence, GSPO's stop-gradient token ratio has exactly the
    gradient of the sequence-level objective, so finite differences must agree."""
    old, new, adv, mask = _grad_inputs(sequence_advantages=True)
    config = make_config(low=0.2, high=0.28)
    fn = get_policy_loss_fn("gspo")
    inputs = (new.clone().requires_grad_(True), adv.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(lambda n, a: fn(old, n, a, mask, "token-mean", config)[0], inputs)


def test_gradcheck_cispo_outside_band_and_weighted_reinforce_inside():
    """CISPO back-propagates sg(clip(r)) * A through log_prob. Outside the band the weight is a
    constant, so finite differences apply directly; inside, the gradient must equal that of
    the REINFORCE surrogate with the weight frozen."""
    old, new, adv, mask = _grad_inputs()
    fn = get_policy_loss_fn("cispo")
    far = old + _t([[1.0, -1.0, 2.0, -2.0], [1.5, -0.9, 0.7, -0.6], [3.0, -3.0, 1.0, -1.0]])
    assert torch.autograd.gradcheck(
        lambda n: fn(old, n, adv, mask, "token-mean", make_config())[0], (far.clone().requires_grad_(True),)
    )
    log_prob = new.clone().requires_grad_(True)
    fn(old, log_prob, adv, mask, "token-mean", make_config())[0].backward()
    weight = torch.clamp(torch.exp(new - old), 0.8, 1.28)
    torch.testing.assert_close(log_prob.grad, -weight * adv * mask / mask.sum())


# ---------------------------------------------------------------- edge cases and config handling
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_fully_masked_rows_and_empty_responses_are_finite(name):
    old, new, adv, mask = _grad_inputs()
    mask = mask.clone()
    mask[1] = 0
    config = make_config(kl_cov_ratio=0.5, clip_cov_ratio=0.5)
    loss, metrics = get_policy_loss_fn(name)(old, new, adv, mask, "seq-mean-token-mean", config)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())
    empty, empty_metrics = get_policy_loss_fn(name)(old, new, adv, torch.zeros_like(mask), "token-mean", config)
    assert empty.item() == 0.0 and all(v == 0.0 for v in empty_metrics.values())


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_configs_as_simplenamespace_and_omegaconf_agree(name):
    old, new, adv, mask = _grad_inputs()
    namespace = make_config(kl_cov_ratio=0.3, clip_cov_ratio=1.0)
    omega = OmegaConf.create(
        {**{k: v for k, v in vars(namespace).items() if k != "policy_loss"}, "policy_loss": vars(namespace.policy_loss)}
    )
    torch.manual_seed(0)
    from_namespace, _ = get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", namespace)
    torch.manual_seed(0)
    from_omega, _ = get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", omega)
    assert from_namespace.item() == from_omega.item()


def test_global_batch_info_makes_split_losses_add_up():
    old, new, adv, mask = _grad_inputs()
    for name, mode in [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean"), ("geo_mean", "token-mean")]:
        fn = get_policy_loss_fn(name)
        whole, _ = fn(old, new, adv, mask, mode, make_config())
        config = make_config()
        config.global_batch_info = {"batch_num_tokens": mask.sum().item(), "global_batch_size": 3}  # 3 non-empty rows
        parts = [fn(old[s], new[s], adv[s], mask[s], mode, config)[0] for s in (slice(0, 1), slice(1, 3))]
        assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-12), name


def test_missing_clip_ratio_and_bad_dual_clip_are_named():
    old, new, adv, mask = _grad_inputs()
    with pytest.raises(ValueError, match="actor.clip_ratio"):
        get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", SimpleNamespace())
    with pytest.raises(ValueError, match="clip_ratio_c"):
        get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", make_config(c=1.0))
    with pytest.raises(ValueError, match="unknown keys"):
        config = make_config()
        config.global_batch_info = {"dp_sise": 2}
        get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", config)


def test_registry_lists_losses_and_accepts_new_ones():
    assert set(LOSS_NAMES) <= set(POLICY_LOSS_REGISTRY.names())
    with pytest.raises(ValueError, match="actor.policy_loss.loss_mode") as error:
        get_policy_loss_fn("ppo2")
    assert "vanilla" in str(error.value) and "kl_cov" in str(error.value)

    with POLICY_LOSS_REGISTRY.temporary():

        @POLICY_LOSS_REGISTRY.register("test_negative_log_prob")
        def negative_log_prob(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
            return agg_loss(-log_prob, response_mask, loss_agg_mode), {}

        loss, _ = get_policy_loss_fn("test_negative_log_prob")(*_grad_inputs(), "token-sum", None)
        old, new, adv, mask = _grad_inputs()
        assert loss.item() == pytest.approx(-(new * mask).sum().item())
