"""Edge cases of the pure layer that mutation testing showed no test pinned down: the
advantage eps, whiten's small-sample and masked positions, the value loss's defaults,
lower clip bound and normaliser, the loss registry's declared knobs, and Registry itself.
Every expected value is computed by hand in the comment beside it."""

from __future__ import annotations

import math

import pytest
import torch

from replayrl.algorithms import aggregate, group_advantages
from replayrl.algorithms.advantages import whiten
from replayrl.algorithms.losses import (
    POLICY_LOSSES,
    call_policy_loss,
    clipped_value_loss,
    register_policy_loss,
)
from replayrl.algorithms.objective import critic_objective
from replayrl.registry import Registry


def test_group_advantages_divide_by_std_plus_eps() -> None:
    # r = [0, 2]: mean 1, unbiased std sqrt(2); eps = 1: A = +-1 / (sqrt(2) + 1) = +-0.414214
    adv, _ = group_advantages(torch.tensor([0.0, 2.0]), torch.tensor([0, 0]), eps=1.0)
    assert adv.tolist() == pytest.approx([-0.414214, 0.414214], abs=1e-6)


def test_whiten_two_values_and_masked_positions() -> None:
    # masked values [1, 3]: mean 2, unbiased std sqrt(2) -> [-0.707107, 0.707107]; the masked
    # position stays exactly 0 (not x / 0)
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = whiten(x, mask)
    assert out[0, :2].tolist() == pytest.approx([-0.707107, 0.707107], abs=1e-6)
    assert out[0, 2].item() == 0.0
    # eps = 1: [-1, 1] / (sqrt(2) + 1) = -+0.414214
    assert whiten(x, mask, eps=1.0)[0, :2].tolist() == pytest.approx(
        [-0.414214, 0.414214], abs=1e-6
    )
    # one value: returned as it is, masked positions 0
    one = whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert one.tolist() == [[5.0, 0.0]]


def test_value_loss_default_clip_lower_bound_and_normaliser() -> None:
    values = torch.tensor([[0.0, 2.0]])
    old = torch.tensor([[1.0, 1.0]])
    returns = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    # default clip 0.5: token 0 moved -1 -> V_clip = 0.5: max((0 - 1)^2, (0.5 - 1)^2) = 1;
    # token 1 moved +1 -> V_clip = 1.5: max(1, 0.25) = 1 -> loss 0.5 * (1 + 1) / 2 = 0.5
    loss, m = clipped_value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(0.5)
    # the default clip is 0.5: V moved 1 -> 3 with R = 3: unclipped 0, clipped V = 1.5 ->
    # 0.5 * (1.5 - 3)^2 = 1.125 (a clip of 1.5 would give 0.5 * 0.25 = 0.125)
    three = torch.tensor([[3.0]])
    loss_default, _ = clipped_value_loss(three, torch.tensor([[1.0]]), three, torch.ones(1, 1))
    assert loss_default.item() == pytest.approx(1.125)
    assert m["value_clip_frac"] == 0.0 and m["value_mse"] == pytest.approx(1.0)
    # returns 0: token 0 unclipped (0 - 0)^2 = 0, clipped (0.5)^2 = 0.25 -> 0.25 wins (the
    # lower bound -clip matters); token 1: max(4, 2.25) = 4 -> 0.5 * (0.25 + 4) = 2.125
    # summed; token_mean with normaliser 5 -> 2.125 / 5 = 0.425
    zero = torch.zeros(1, 2)
    loss, m = clipped_value_loss(values, old, zero, mask, clip=0.5, normaliser=5.0)
    assert loss.item() == pytest.approx(0.425)
    assert m["value_clip_frac"] == pytest.approx(0.5)
    loss, m = critic_objective(values, old, zero, mask, 0.5, "token_mean", 5.0)
    assert loss.item() == pytest.approx(0.425)
    # no clip: 0.5 * (0 + 4) / 2 = 1.0, and no clipped share at all
    loss, m = critic_objective(values, old, zero, mask, None, "token_mean", None)
    assert loss.item() == pytest.approx(1.0) and m["value_clip_frac"] == 0.0
    assert isinstance(m["value_clip_frac"], float)


def test_dr_grpo_without_normaliser_says_what_it_needs() -> None:
    with pytest.raises(ValueError, match=r"^loss_agg=dr_grpo needs normaliser = batch size"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "dr_grpo", None)


def test_a_loss_gets_exactly_its_declared_knobs_and_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"policy loss 'bad': unknown inputs/knobs \['gamma'\]"):
        register_policy_loss("bad", knobs=("gamma",))
    assert "bad" not in POLICY_LOSSES
    seen = {}

    @register_policy_loss("knob_probe", inputs=("rewards",), knobs=("epsilon",))
    def probe(logprobs, old_logprobs, advantages, mask, *, loss_agg, normaliser, **kw):
        seen.update(kw, loss_agg=loss_agg, normaliser=normaliser)
        return logprobs.sum(), {}

    try:
        spec = POLICY_LOSSES.get("knob_probe")
        assert spec.inputs == ("rewards",) and spec.knobs == {"epsilon": "algorithm.epsilon"}
        t = torch.zeros(1, 1)
        call_policy_loss(
            "knob_probe",
            t,
            t,
            torch.zeros(1),
            t,
            available={"rewards": 1.0, "baselines": 2.0},
            knobs={"epsilon": 0.3, "delta_v": 9.0},
            loss_agg="seq_mean",
            normaliser=4.0,
        )
        assert seen == {"rewards": 1.0, "epsilon": 0.3, "loss_agg": "seq_mean", "normaliser": 4.0}
    finally:
        POLICY_LOSSES.remove("knob_probe")
    assert "knob_probe" not in POLICY_LOSSES


def test_registry_add_get_remove_and_its_errors() -> None:
    reg: Registry[int] = Registry("widget", "section.widget")
    assert reg.kind == "widget" and reg.config_key == "section.widget" and len(reg) == 0
    reg.add("b", 2)
    reg.register("a")(1)
    assert list(reg) == ["a", "b"] and reg.get("a") == 1 and reg.check("b") == "b"
    with pytest.raises(ValueError, match=r"^section.widget: unknown widget 'c' \(known: a, b\)"):
        reg.get("c")
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.add("a", 3)
    reg.remove("a")
    reg.remove("never-there")  # removing an unknown name is not an error
    assert "a" not in reg and list(reg) == ["b"]


def test_kl_convex_mixes_base_and_previous_policy_by_lambda() -> None:
    from replayrl.algorithms.kl import kl_convex

    # k1 = log pi - log pi_ref: base gives [1, 2], prev gives [3, 1]
    lp = torch.tensor([[0.0, 0.0]])
    base, prev = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -1.0]])
    # lambda 0.25: 0.25 * [1, 2] + 0.75 * [3, 1] = [2.5, 1.25]
    out = kl_convex(lp, base, prev, 0.25, "k1")
    assert out[0].tolist() == pytest.approx([2.5, 1.25])
    assert kl_convex(lp, None, prev, 0.0, "k1").tolist() == [[3.0, 1.0]]  # pi_{k-1} only
    assert kl_convex(lp, base, None, 1.0, "k1").tolist() == [[1.0, 2.0]]  # pi_base only
    with pytest.raises(ValueError, match=r"^KL-Convex: lambda > 0 needs the base policy's"):
        kl_convex(lp, None, prev, 0.5, "k1")
    with pytest.raises(ValueError, match=r"^KL-Convex: lambda < 1 needs the previous policy's"):
        kl_convex(lp, base, None, 0.5, "k1")


def test_kl_term_is_beta_times_the_aggregated_convex_kl() -> None:
    from replayrl.algorithms.objective import ObjectiveWeights, kl_term

    lp = torch.tensor([[0.0, 0.0]])
    base, prev = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -1.0]])
    mask = torch.ones(1, 2)
    # w_base 0.1, w_prev 0.3: lambda 0.25 -> per token [2.5, 1.25], sum 3.75;
    # token_mean with normaliser 3: 1.25; times (0.1 + 0.3): 0.5
    w = ObjectiveWeights(kl_base=0.1, kl_prev=0.3, kl_estimator="k1")
    assert kl_term(lp, base, prev, mask, w, 3.0).item() == pytest.approx(0.5)
    # k3 instead of k1 (the estimator reaches kl_convex): k3(d) = e^-d - 1 + d
    w3 = ObjectiveWeights(kl_base=0.1, kl_prev=0.3, kl_estimator="k3")
    k3 = [math.exp(-d) - 1 + d for d in (1.0, 2.0, 3.0, 1.0)]
    per_token = [0.25 * k3[0] + 0.75 * k3[2], 0.25 * k3[1] + 0.75 * k3[3]]
    expected = 0.4 * sum(per_token) / 2
    assert kl_term(lp, base, prev, mask, w3, None).item() == pytest.approx(expected, rel=1e-6)
