"""Tests for replayrl.algorithms: group advantages and policy losses vs hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from replayrl.algorithms import (
    POLICY_LOSSES,
    aggregate,
    get_policy_loss,
    group_advantages,
    register_policy_loss,
)

# eps in the advantage denominator is 1e-6, so values are only good to ~1e-5 relative
ADV_TOL = 1e-5


def _adv(rewards, groups, **kw):
    return group_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups), **kw)


# -- advantages -----------------------------------------------------------------------------


def test_advantages_one_group():
    # r = [1, 0, 0, 1]: mean 0.5, deviations +-0.5,
    # unbiased var = 4 * 0.25 / 3 = 1/3 -> std = 0.577350; A = +-0.5 / 0.577350 = +-0.866025
    adv, means = _adv([1, 0, 0, 1], [0, 0, 0, 0])
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=ADV_TOL)
    assert means.tolist() == pytest.approx([0.5] * 4)
    assert adv.dtype == torch.float32
    assert means.dtype == torch.float32


def test_advantages_two_groups_of_different_sizes_interleaved():
    # group 7: r = [2, 4, 9], mean 5, deviations [-3, -1, 4],
    #   unbiased var = (9 + 1 + 16) / 2 = 13 -> std = 3.605551,
    #   A = [-0.832050, -0.277350, 1.109400]
    # group 3: r = [1, 3], mean 2, deviations [-1, 1],
    #   unbiased var = 2 / 1 = 2 -> std = 1.414214, A = [-0.707107, 0.707107]
    adv, means = _adv([2, 1, 4, 3, 9], [7, 3, 7, 3, 7])
    assert adv.tolist() == pytest.approx(
        [-0.832050, -0.707107, -0.277350, 0.707107, 1.109400], abs=ADV_TOL
    )
    assert means.tolist() == pytest.approx([5, 2, 5, 2, 5])


def test_advantages_constant_group_is_zero():
    # all rewards equal: every deviation is 0 and std is 0 -> A = 0 / eps = 0 (no NaN)
    adv, means = _adv([0.5, 0.5, 0.5], [1, 1, 1])
    assert adv.tolist() == [0.0, 0.0, 0.0]
    assert means.tolist() == pytest.approx([0.5, 0.5, 0.5])


def test_advantages_single_member_group_is_zero():
    # group 2 has one member (r = 3): its mean is 3, A = 0 (std of one sample is undefined)
    # group 0: r = [0, 1], mean 0.5, std = sqrt(0.5) = 0.707107, A = -+0.707107
    adv, means = _adv([0, 3, 1], [0, 2, 0])
    assert adv.tolist() == pytest.approx([-0.707107, 0.0, 0.707107], abs=ADV_TOL)
    assert means.tolist() == pytest.approx([0.5, 3.0, 0.5])
    assert torch.isfinite(adv).all()


def test_advantages_dr_grpo_no_std_scaling():
    # scale_rewards=False (Dr.GRPO): A = r - group mean
    # group 7: [2, 4, 9] - 5 = [-3, -1, 4]; group 3: [1, 3] - 2 = [-1, 1]
    adv, means = _adv([2, 1, 4, 3, 9], [7, 3, 7, 3, 7], scale_rewards=False)
    assert adv.tolist() == pytest.approx([-3, -1, -1, 1, 4])
    assert means.tolist() == pytest.approx([5, 2, 5, 2, 5])


def test_advantages_sum_to_zero_per_group():
    adv, _ = _adv([0.3, 1.0, 0.0, 0.7, 0.2, 0.9], [0, 0, 0, 1, 1, 1])
    assert float(adv[:3].sum()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[3:].sum()) == pytest.approx(0.0, abs=1e-6)


# -- aggregation ----------------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregate_token_mean():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5; the 100s are masked
    assert float(aggregate(PER_TOKEN, AGG_MASK, "token_mean")) == pytest.approx(2.5)


def test_aggregate_seq_mean():
    # sequence means: (1 + 2 + 3) / 3 = 2 and 4 / 1 = 4 -> (2 + 4) / 2 = 3
    assert float(aggregate(PER_TOKEN, AGG_MASK, "seq_mean")) == pytest.approx(3.0)


def test_aggregate_with_normaliser():
    # token_mean: masked sum 10 / normaliser 8; seq_mean: (2 + 4) / normaliser 4
    assert float(aggregate(PER_TOKEN, AGG_MASK, "token_mean", 8.0)) == pytest.approx(1.25)
    assert float(aggregate(PER_TOKEN, AGG_MASK, "seq_mean", 4.0)) == pytest.approx(1.5)


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError, match="seq_sum"):
        aggregate(PER_TOKEN, AGG_MASK, "seq_sum")


# -- grpo_clip ------------------------------------------------------------------------------

# Two sequences of 4 tokens; old log-probs are 0 so ratio = exp(logprob).
# seq 0, A = +1, ratios [1.1, 1.5, 0.5, 1.0]; seq 1, A = -2, ratios [0.5, 1.5, 0.9, (3.0 masked)]
RATIOS = [[1.1, 1.5, 0.5, 1.0], [0.5, 1.5, 0.9, 3.0]]
ADVANTAGES = [1.0, -2.0]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]
# per-token loss -min(rho A, clip(rho, 0.8, 1.2) A), eps = 0.2:
#   seq 0 (A=+1): 1.1 -> -1.1 | 1.5 -> clip 1.2 -> -1.2 (clipped) | 0.5 -> min(0.5, 0.8) -> -0.5
#                 | 1.0 -> -1.0                                  sum -3.8 over 4 tokens
#   seq 1 (A=-2): 0.5 -> min(-1.0, -1.6) -> 1.6 (clipped) | 1.5 -> min(-3.0, -2.4) -> 3.0
#                 | 0.9 -> 1.8                                   sum 6.4 over 3 tokens
# token_mean = (-3.8 + 6.4) / 7 = 0.371429;  seq_mean = (-3.8/4 + 6.4/3) / 2 = 0.591667
# clipped tokens: 2 of 7; ratio mean over the 7 unmasked: 7.0 / 7 = 1.0; max 1.5 (3.0 is masked)


def _grpo_inputs(ratios=RATIOS, advantages=ADVANTAGES, mask=MASK):
    logprobs = torch.log(torch.tensor(ratios, dtype=torch.float32)).requires_grad_(True)
    old = torch.zeros_like(logprobs)
    return logprobs, old, torch.tensor(advantages), torch.tensor(mask, dtype=torch.float32)


def test_grpo_clip_token_mean_value_and_metrics():
    logprobs, old, adv, mask = _grpo_inputs()
    loss, metrics = get_policy_loss("grpo_clip")(logprobs, old, adv, mask, epsilon=0.2)
    assert loss.item() == pytest.approx(2.6 / 7, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(2 / 7)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.5, abs=1e-6)
    # k3 estimator r - 1 - log r over the 7 unmasked ratios
    unmasked = [1.1, 1.5, 0.5, 1.0, 0.5, 1.5, 0.9]
    k3 = sum(r - 1 - math.log(r) for r in unmasked) / 7
    assert metrics["approx_kl"] == pytest.approx(k3, abs=1e-6)


def test_grpo_clip_seq_mean_value():
    logprobs, old, adv, mask = _grpo_inputs()
    loss, _ = get_policy_loss("grpo_clip")(
        logprobs, old, adv, mask, epsilon=0.2, loss_agg="seq_mean"
    )
    assert loss.item() == pytest.approx((-3.8 / 4 + 6.4 / 3) / 2, abs=1e-6)


def test_grpo_clip_gradient_is_zero_exactly_where_clipped():
    # d(-rho A)/d logprob = -A rho / 7 for unclipped tokens; 0 where the clip is active or masked
    logprobs, old, adv, mask = _grpo_inputs()
    loss, _ = get_policy_loss("grpo_clip")(logprobs, old, adv, mask, epsilon=0.2)
    loss.backward()
    expected = [[-1.1 / 7, 0.0, -0.5 / 7, -1.0 / 7], [0.0, 3.0 / 7, 1.8 / 7, 0.0]]
    assert torch.allclose(logprobs.grad, torch.tensor(expected), atol=1e-6)


def test_grpo_clip_asymmetric_epsilon_high():
    # A = +1, ratios [1.25, 1.5, 0.7]; window [1 - 0.2, 1 + 0.28] = [0.8, 1.28]:
    #   1.25 inside -> -1.25 | 1.5 -> -1.28 (clipped) | 0.7 -> min(0.7, 0.8) -> -0.7
    #   loss = -(1.25 + 1.28 + 0.7) / 3 = -1.076667, clip_frac 1/3
    # symmetric eps = 0.2, window [0.8, 1.2]: -(1.2 + 1.2 + 0.7) / 3 = -1.033333, clip_frac 2/3
    # A = -1, ratio 0.7: the low side is still 1 - epsilon = 0.8 -> -min(-0.7, -0.8) = 0.8
    loss_fn = get_policy_loss("grpo_clip")
    logprobs, old, adv, mask = _grpo_inputs([[1.25, 1.5, 0.7]], [1.0], [[1, 1, 1]])
    loss, m = loss_fn(logprobs, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert loss.item() == pytest.approx(-3.23 / 3, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(1 / 3)
    loss, m = loss_fn(logprobs, old, adv, mask, epsilon=0.2)
    assert loss.item() == pytest.approx(-3.1 / 3, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    logprobs, old, adv, mask = _grpo_inputs([[0.7]], [-1.0], [[1]])
    loss, m = loss_fn(logprobs, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert loss.item() == pytest.approx(0.8, abs=1e-6)
    assert m["clip_frac"] == 1.0


def test_grpo_clip_ignores_masked_tokens():
    logprobs, old, adv, mask = _grpo_inputs()
    loss_fn = get_policy_loss("grpo_clip")
    base, base_m = loss_fn(logprobs, old, adv, mask)
    # change the masked token's log-prob and old log-prob wildly: nothing may move
    lp2 = logprobs.detach().clone()
    lp2[1, 3] = 5.0
    old2 = old.clone()
    old2[1, 3] = -30.0
    lp2.requires_grad_(True)
    loss, m = loss_fn(lp2, old2, adv, mask)
    assert loss.item() == pytest.approx(base.item(), abs=1e-7)
    assert m == pytest.approx(base_m)
    loss.backward()
    assert float(lp2.grad[1, 3]) == 0.0


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("loss_type", ["grpo_clip", "asymre"])
def test_normaliser_makes_micro_batches_sum_to_full_batch(loss_type: str, loss_agg: str):
    torch.manual_seed(0)
    n, t = 6, 5
    logprobs = (-torch.rand(n, t) * 2).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(n, t)
    adv = torch.randn(n)
    rewards = torch.rand(n)
    baselines = torch.rand(n)
    lengths = [5, 1, 3, 4, 2, 5]  # ragged sequences
    mask = torch.tensor([[1.0] * k + [0.0] * (t - k) for k in lengths])
    loss_fn = get_policy_loss(loss_type)
    extra = {"rewards": rewards, "baselines": baselines} if loss_type == "asymre" else {}
    kw = {"loss_agg": loss_agg, **extra}
    full, _ = loss_fn(logprobs, old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full, logprobs)
    normaliser = float(mask.sum()) if loss_agg == "token_mean" else float(n)
    total = torch.zeros(())
    grads = torch.zeros_like(logprobs)
    for part in (slice(0, 1), slice(1, 4), slice(4, 6)):
        lp = logprobs[part].detach().requires_grad_(True)
        kw_part = {k: v[part] if k in extra else v for k, v in kw.items()}
        loss, _ = loss_fn(lp, old[part], adv[part], mask[part], normaliser=normaliser, **kw_part)
        loss.backward()
        total = total + loss.detach()
        grads[part] = lp.grad
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(grads, full_grad, atol=1e-7)
    # without the normaliser each micro-batch is its own mean: the sum would be wrong
    naive = 0.0
    for p in (slice(0, 1), slice(1, 4), slice(4, 6)):
        kw_part = {k: v[p] if k in extra else v for k, v in kw.items()}
        naive += loss_fn(logprobs[p].detach(), old[p], adv[p], mask[p], **kw_part)[0].item()
    assert naive != pytest.approx(full.item(), abs=1e-3)


# -- asymre ---------------------------------------------------------------------------------

# rewards [1, 0], V = group mean [0.5, 0.5], dV = -0.1 -> weights r - (V + dV) = [0.6, -0.4]
# log-probs [[-0.5, -1.0], [-2.0, (masked) -0.25]]; per-token loss -w * logp:
#   row 0: 0.3, 0.6 | row 1: -(-0.4)(-2.0) = -0.8
# token_mean = (0.3 + 0.6 - 0.8) / 3 = 0.033333; seq_mean = ((0.9 / 2) + (-0.8 / 1)) / 2 = -0.175
# gradient (token_mean) = -w / 3: row 0 -0.2, -0.2; row 1 +0.133333, masked 0


def _asymre_inputs():
    logprobs = torch.tensor([[-0.5, -1.0], [-2.0, -0.25]], requires_grad=True)
    old = torch.tensor([[-0.4, -1.3], [-1.0, -0.2]])
    adv = torch.tensor([123.0, -45.0])  # ignored by AsymRE
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kw = {"rewards": torch.tensor([1.0, 0.0]), "baselines": torch.tensor([0.5, 0.5])}
    return logprobs, old, adv, mask, kw


def test_asymre_value_and_gradient():
    logprobs, old, adv, mask, kw = _asymre_inputs()
    loss, metrics = get_policy_loss("asymre")(logprobs, old, adv, mask, delta_v=-0.1, **kw)
    assert loss.item() == pytest.approx(0.1 / 3, abs=1e-6)
    assert metrics["clip_frac"] == 0.0
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.2, -0.2], [0.4 / 3, 0.0]]), atol=1e-6)


def test_asymre_seq_mean_and_no_ratio_or_advantage_dependence():
    logprobs, old, adv, mask, kw = _asymre_inputs()
    loss_fn = get_policy_loss("asymre")
    loss, _ = loss_fn(logprobs, old, adv, mask, delta_v=-0.1, loss_agg="seq_mean", **kw)
    assert loss.item() == pytest.approx(-0.175, abs=1e-6)
    # old log-probs and advantages do not enter the loss
    other, _ = loss_fn(logprobs, old - 1.0, -adv, mask, delta_v=-0.1, loss_agg="seq_mean", **kw)
    assert other.item() == pytest.approx(loss.item(), abs=1e-7)
    # dV shifts every weight: dV = 0 -> weights [0.5, -0.5]:
    #   token_mean = (0.25 + 0.5 - 1.0) / 3 = -0.083333
    zero_dv, _ = loss_fn(logprobs, old, adv, mask, delta_v=0.0, **kw)
    assert zero_dv.item() == pytest.approx(-0.25 / 3, abs=1e-6)


# -- registry -------------------------------------------------------------------------------


def test_builtin_losses_registered():
    assert {"grpo_clip", "asymre"} <= set(POLICY_LOSSES)


def test_unknown_loss_names_it():
    with pytest.raises(ValueError, match="'ppo_kl'") as info:
        get_policy_loss("ppo_kl")
    assert "grpo_clip" in str(info.value)  # lists the known names


def test_duplicate_registration_rejected():
    before = POLICY_LOSSES.get("grpo_clip")
    with pytest.raises(ValueError, match="grpo_clip"):
        register_policy_loss("grpo_clip")(lambda *a, **k: None)
    assert POLICY_LOSSES.get("grpo_clip") is before


def test_register_new_loss_then_lookup():
    name = "_test_only_loss"

    def fn(logprobs, old_logprobs, advantages, mask, *, loss_agg, normaliser, rewards):
        return (logprobs * rewards.unsqueeze(-1)).sum(), {}

    try:
        assert register_policy_loss(name, inputs=("rewards",))(fn) is fn
        assert get_policy_loss(name) is fn
        assert POLICY_LOSSES.get(name).inputs == ("rewards",)
    finally:
        POLICY_LOSSES.remove(name)


def test_ratio_metrics_hand_computed():
    from replayrl.algorithms.losses import ratio_metrics

    # log rho = [ln 2, 0, ln 0.5, ln 4], the last token masked out:
    # rho = [2, 1, 0.5] on the mask -> mean 3.5 / 3, max 2
    # k3 = rho - 1 - ln rho = [1 - ln 2, 0, -0.5 + ln 2] -> mean 0.5 / 3
    log_ratio = torch.log(torch.tensor([[2.0, 1.0, 0.5, 4.0]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    clipped = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    m = ratio_metrics(log_ratio, mask, clipped)
    assert list(m) == ["clip_frac", "approx_kl", "ratio_mean", "ratio_max"]
    assert m["clip_frac"] == pytest.approx(2 / 3)
    assert m["approx_kl"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert m["ratio_mean"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert m["ratio_max"] == pytest.approx(2.0, abs=1e-6)
    assert ratio_metrics(log_ratio, mask)["clip_frac"] == 0.0  # no clipping -> 0.0
    empty = ratio_metrics(log_ratio, torch.zeros_like(mask))
    assert empty["ratio_max"] == 1.0 and empty["ratio_mean"] == 0.0
