"""Truncated importance sampling (algorithms/correction.py), against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from replayrl.algorithms.correction import (
    apply_token_weights,
    truncated_is_weights,
    weight_stats,
)


def test_weights_by_hand():
    # pi_learner / pi_sampler = 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.3 = 3 (truncated to 2)
    learner = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]], requires_grad=True)
    sampler = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.3)]])
    w = truncated_is_weights(learner, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.0]]), atol=1e-6)
    assert not w.requires_grad  # a constant in the surrogate
    # a higher cap keeps the 3
    w = truncated_is_weights(learner, sampler, cap=5.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 3.0]]), atol=1e-6)


def test_equal_logprobs_give_weight_one():
    lp = torch.tensor([-0.1, -3.0, -12.0])
    assert torch.equal(truncated_is_weights(lp, lp.clone(), cap=2.0), torch.ones(3))


def test_bad_inputs_are_errors():
    a = torch.zeros(3)
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(a, a, cap=0.0)
    with pytest.raises(ValueError, match="shape"):
        truncated_is_weights(a, torch.zeros(4), cap=2.0)
    with pytest.raises(ValueError, match="non-finite"):
        truncated_is_weights(a, torch.tensor([0.0, -math.inf, 0.0]), cap=2.0)
    with pytest.raises(ValueError, match="non-negative"):
        apply_token_weights(torch.ones(1), torch.tensor([[-1.0]]))
    with pytest.raises(ValueError, match="do not match"):
        apply_token_weights(torch.ones(2), torch.ones(3, 4))


def test_advantages_scaled_per_token():
    adv = torch.tensor([1.0, -2.0])  # one advantage per sequence
    w = torch.tensor([[1.0, 0.5], [2.0, 0.0]])
    assert torch.equal(apply_token_weights(adv, w), torch.tensor([[1.0, 0.5], [-4.0, 0.0]]))
    token_adv = torch.tensor([[1.0, 3.0], [-1.0, 2.0]])
    assert torch.equal(apply_token_weights(token_adv, w), torch.tensor([[1.0, 1.5], [-2.0, 0.0]]))


def test_scaling_the_advantage_scales_the_clipped_surrogate():
    """w * min(r A, clip(r) A) == min(r wA, clip(r) wA): r = 1.3, A = 1, eps = 0.2 gives
    min(1.3, 1.2) = 1.2; with w = 0.5 both sides are 0.6 (and with A = -1: -0.65)."""

    def surrogate(r: float, a: float, eps: float = 0.2) -> float:
        return min(r * a, max(min(r, 1 + eps), 1 - eps) * a)

    for a, want in ((1.0, 0.6), (-1.0, -0.65)):
        wa = float(apply_token_weights(torch.tensor([a]), torch.tensor([[0.5]])))
        assert surrogate(1.3, wa) == pytest.approx(want)
        assert 0.5 * surrogate(1.3, a) == pytest.approx(want)


def test_weight_stats_by_hand():
    w = torch.tensor([[2.0, 0.5, 1.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    s = weight_stats(w, mask, cap=2.0)
    assert s["tis/mean_weight"] == pytest.approx((2.0 + 0.5 + 1.0 + 2.0) / 4)
    assert s["tis/truncated_share"] == pytest.approx(0.5)
    assert math.isnan(weight_stats(w, torch.zeros_like(mask), 2.0)["tis/mean_weight"])


def test_importance_weights_of_trls_four_modes_hand_values():
    """log rho_t = (0.5, -0.2, 1.5) with C = 3: token ratios e^.5 = 1.6487, e^-.2 = 0.8187,
    e^1.5 = 4.4817; the sequence ratio e^1.8 = 6.0496 > C."""
    from replayrl.algorithms.correction import importance_weights

    learner = torch.tensor([-1.0, -2.0, -0.5])
    sampler = torch.tensor([-1.5, -1.8, -2.0])
    want = {
        "token_truncate": [1.6487, 0.8187, 3.0],
        "token_mask": [1.6487, 0.8187, 0.0],
        "sequence_truncate": [3.0, 3.0, 3.0],
        "sequence_mask": [0.0, 0.0, 0.0],
    }
    for mode, w in want.items():
        got = importance_weights(learner, sampler, 3.0, mode)
        assert torch.allclose(got, torch.tensor(w), atol=1e-4), mode
    # a sequence under the cap keeps its product ratio on every token: e^(0.5 - 0.2) = 1.3499
    seq = importance_weights(learner[:2], sampler[:2], 3.0, "sequence_mask")
    assert torch.allclose(seq, torch.full((2,), 1.3499), atol=1e-4)
    huge = importance_weights(torch.zeros(2), torch.full((2,), -800.0), 3.0, "sequence_mask")
    assert torch.equal(huge, torch.zeros(2))  # no inf * 0
    with pytest.raises(ValueError, match="one of token_truncate"):
        importance_weights(learner, sampler, 3.0, "sequence")
    with pytest.raises(ValueError, match="positive"):
        importance_weights(learner, sampler, 0.0, "token_mask")
