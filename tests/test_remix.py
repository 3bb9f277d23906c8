"""ReMix pieces (paper 2) against hand-computed values, and the engine's ReMix/PPO modes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from replayrl.algorithms.advantages import gae
from replayrl.algorithms.kl import kl_convex, kl_convex_lambda, kl_estimate
from replayrl.algorithms.losses import clipped_value_loss, get_policy_loss
from replayrl.config.schema import load_config
from replayrl.learner.learner import Learner
from replayrl.run.metrics import read_metrics
from replayrl.run.start import train
from replayrl.storage.checkpoint import load_state
from tiny import tiny_config

LOG = math.log


@pytest.mark.parametrize(
    ("t", "lam"),
    [(0, 1.0), (50, 1.0), (51, 0.9), (60, 0.9), (61, 0.8), (90, 0.6), (91, 0.5), (200, 0.5)],
)
def test_kl_convex_lambda_schedule(t: int, lam: float) -> None:
    # lambda(t) = max(1 - 0.1 * ceil(max(t - 50, 0) / 10), 0.5); e.g. t=61: ceil(11/10)=2 -> 0.8
    assert kl_convex_lambda(t) == pytest.approx(lam)


def test_kl_estimators_hand_values() -> None:
    # pi = 0.5, pi_ref = 0.25: log(pi_ref/pi) = log 0.5 = -0.693147
    lp, ref = torch.tensor([LOG(0.5)]), torch.tensor([LOG(0.25)])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * 0.693147**2, abs=1e-6)
    # k3 = r - 1 - log r with r = 0.5: 0.5 - 1 + 0.693147 = 0.193147
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(lp, ref, "k4")


def test_kl_convex_mixes_base_and_previous() -> None:
    lp = torch.tensor([LOG(0.5)])
    base, prev = torch.tensor([LOG(0.25)]), torch.tensor([LOG(0.5)])  # KL to prev = 0
    # lambda 0.8: 0.8 * 0.193147 + 0.2 * 0 = 0.154518
    assert kl_convex(lp, base, prev, 0.8).item() == pytest.approx(0.154518, abs=1e-6)
    assert kl_convex(lp, base, None, 1.0).item() == pytest.approx(0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="previous policy"):
        kl_convex(lp, base, None, 0.5)


def test_mix_ppg_equals_ppo_clip_on_fresh_data() -> None:
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 6, generator=g) * 0.3 - 1
    old = lp + torch.randn(4, 6, generator=g) * 0.3
    adv = torch.randn(4, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    mix, ppo = get_policy_loss("mix_ppg"), get_policy_loss("grpo_clip")
    for kw in ({"loss_agg": "token_mean"}, {"loss_agg": "seq_mean", "epsilon_high": 0.28}):
        ref, _ = ppo(lp, old, adv, mask, **kw)
        # no anchor, or an anchor equal to the behaviour policy: c = 1
        assert torch.equal(mix(lp, old, adv, mask, **kw)[0], ref)
        assert torch.equal(mix(lp, old, adv, mask, anchor_logprobs=old, **kw)[0], ref)


def test_mix_ppg_clip_window_is_centred_on_current_over_behaviour() -> None:
    mix, ppo = get_policy_loss("mix_ppg"), get_policy_loss("grpo_clip")
    beh = torch.tensor([[LOG(0.5)]])
    anchor = torch.tensor([[LOG(0.6)]])  # c = 0.6 / 0.5 = 1.2 -> window [1.0, 1.4]
    mask = torch.ones(1, 1)
    # pi_theta = 0.8: r = 1.6, A = +1 -> min(1.6, 1.4) = 1.4 (plain PPO: clip at 1.2)
    lp = torch.tensor([[LOG(0.8)]])
    pos = torch.tensor([1.0])
    assert mix(lp, beh, pos, mask, anchor_logprobs=anchor)[0].item() == pytest.approx(-1.4)
    assert ppo(lp, beh, pos, mask)[0].item() == pytest.approx(-1.2)
    # pi_theta = 0.45: r = 0.9, A = -1 -> -min(-0.9, -max(0.9, 1.0)) = 1.0 (plain PPO: 0.9)
    lp = torch.tensor([[LOG(0.45)]])
    neg = torch.tensor([-1.0])
    assert mix(lp, beh, neg, mask, anchor_logprobs=anchor)[0].item() == pytest.approx(1.0)
    assert ppo(lp, beh, neg, mask)[0].item() == pytest.approx(0.9)


def test_gae_hand_worked() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.5, 0.7], [0.4, 0.6, 9.0]])  # 9.0 sits on padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # gamma = lam = 1: A_t = R - V_t -> [0.8, 0.5, 0.3] and [0.6, 0.4, 0]
    assert torch.allclose(adv, torch.tensor([[0.8, 0.5, 0.3], [0.6, 0.4, 0.0]]))
    assert torch.allclose(ret[0], torch.ones(3)) and torch.allclose(ret[1, :2], torch.ones(2))
    # gamma = 0.9, lam = 0.5: delta = [0.45-0.2, 0.63-0.5, 1-0.7] = [0.25, 0.13, 0.3]
    # A2 = 0.3; A1 = 0.13 + 0.45*0.3 = 0.265; A0 = 0.25 + 0.45*0.265 = 0.36925
    adv, _ = gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.36925, 0.265, 0.3]]))


def test_value_loss_clipping_hand_values() -> None:
    values = torch.tensor([[1.0, 0.6]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[1.0, 0.0]])
    mask = torch.ones(1, 2)
    # token 0: unclipped 0, clipped V = 0.5 + 0.2 = 0.7 -> 0.09 -> 0.5*0.09 = 0.045
    # token 1: V moved 0.1 (inside the clip): 0.5 * 0.36 = 0.18; mean = 0.1125
    loss, m = clipped_value_loss(values, old, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.1125)
    assert m["value_clip_frac"] == pytest.approx(0.5)
    loss, _ = clipped_value_loss(values, old, returns, mask, clip=None)
    assert loss.item() == pytest.approx(0.09)  # (0 + 0.18) / 2


def _tiny_cfg(tmp_path: Path, *extra: str):
    return tiny_config(tmp_path, *extra)


def test_learner_keeps_frozen_copies_only_when_weighted(tiny_model) -> None:
    cfg = load_config(None, ["kl.beta=0"])
    assert Learner(tiny_model, 0, cfg).base_model is None
    cfg = load_config(None, ["kl.beta=0.001", "kl.target=convex"])
    learner = Learner(tiny_model, 0, cfg)
    assert learner.base_model is not None and learner.prev_model is None
    assert learner.kl_weights(50) == pytest.approx((0.001, 0.0))
    assert learner.kl_weights(61) == pytest.approx((0.0008, 0.0002))


def test_reincarnation_resets_base_to_current_policy(tiny_model) -> None:
    import copy

    model = copy.deepcopy(tiny_model)
    learner = Learner(model, 0, load_config(None, ["kl.beta=0.001"]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    before = next(learner.base_model.parameters()).clone()
    learner.reincarnate()
    after = next(learner.base_model.parameters())
    assert not torch.equal(before, after)
    assert torch.equal(after, next(model.parameters()))
    assert not after.requires_grad


def test_remix_run_mixes_then_reincarnates(tmp_path: Path) -> None:
    cfg = _tiny_cfg(
        tmp_path,
        "logging.name=remix",
        "train.steps=4",
        "algorithm.loss_type=mix_ppg",
        "method.name=remix",
        "method.remix.reincarnation_step=2",
        "method.remix.off_policy_fraction=0.5",
        "method.remix.composition=additive",
        "kl.beta=0.001",
        "kl.target=convex",
        "algorithm.entropy_coef=0.001",
    )
    summary = train(cfg, log=lambda _: None)
    steps = {m["step"]: m for m in read_metrics(tmp_path / "remix/metrics.jsonl") if m["step"]}
    assert summary["reincarnation_step"] == 2
    # step 1: nothing older yet; step 2: R fresh + p/(1-p) R = 8 stale from the last policy
    assert steps[1]["batch/batch_size"] == 8 and steps[1]["train/off_policy/tokens"] == 0
    assert steps[2]["batch/batch_size"] == 16 and steps[2]["train/off_policy/tokens"] > 0
    assert steps[2]["batch/age_max"] == 1
    # after reincarnation (steps 3, 4): fresh data only, p = 0, one pass (utd_after = 1)
    for s in (3, 4):
        assert steps[s]["batch/batch_size"] == 8 and steps[s]["train/off_policy/tokens"] == 0
    assert summary["rollouts_generated"] == 4 * 8  # only the fresh part is generated


def test_ppo_with_critic_trains_value_head(tmp_path: Path) -> None:
    cfg = _tiny_cfg(
        tmp_path,
        "logging.name=ppo",
        "train.steps=2",
        "algorithm.advantage=gae",
        "critic.lr=1e-2",
        "checkpoint.every=1",
        # a random tiny model is never correct; the format reward gives the critic a signal
        "rewards=[{name: digits_format}]",
    )
    train(cfg, log=lambda _: None)
    steps = [m for m in read_metrics(tmp_path / "ppo/metrics.jsonl") if "train/value_loss" in m]
    assert len(steps) == 2 and all(math.isfinite(m["train/value_loss"]) for m in steps)
    state = load_state(tmp_path / "ppo/checkpoints/step_000002")
    head = state["learner"]["critic"]["head.weight"]
    assert head.abs().sum() > 0  # moved from its zero initialisation


def test_fixed_composition_run_budget_and_reincarnation_share(tmp_path: Path) -> None:
    # P = 2 prompts x 4 = R = 8; p = 0.5: mixing steps generate round(0.5 x 2) = 1 prompt = 4
    # fresh + 4 from the window (B = 8); budget 40 rollouts, reincarnation at 0.2 x 40 = 8
    # generated: steps 1, 2 mix (4 + 4 generated), step 3 starts with 8 -> reincarnation,
    # then 8 per step: 16, 24, 32, 40 -> the budget is spent after step 6 (train.steps=50)
    cfg = _tiny_cfg(
        tmp_path,
        "logging.name=fixed",
        "train.steps=50",
        "train.rollout_budget=40",
        "eval.every_rollouts=16",
        "algorithm.loss_type=mix_ppg",
        "method.name=remix",
        "method.remix.reincarnation_step=null",
        "method.remix.reincarnation_at=0.2",
        "method.remix.off_policy_fraction=0.5",
    )
    assert cfg.method.remix.composition == "fixed"  # the default
    summary = train(cfg, log=lambda _: None)
    rows = read_metrics(tmp_path / "fixed/metrics.jsonl")
    steps = {m["step"]: m for m in rows if m["step"] and "rollouts_generated" in m}
    assert summary["reincarnation_step"] == 2  # counted from 0: the third step
    assert [steps[s]["rollouts_generated"] for s in sorted(steps)] == [4, 8, 16, 24, 32, 40]
    assert [steps[s]["batch/batch_size"] for s in sorted(steps)] == [4, 8, 8, 8, 8, 8]
    assert steps[1]["train/off_policy/tokens"] == 0 and steps[2]["train/off_policy/tokens"] > 0
    assert 0 < steps[2]["train/off_policy/ess"] <= 1 and steps[2]["batch/age_max"] == 1
    assert all(steps[s]["train/off_policy/tokens"] == 0 for s in (3, 4, 5, 6))
    # evals at the start, after crossing 16 (step 3) and 32 (step 5), and at the end (step 6)
    assert [e["step"] for e in summary["evals"]] == [0, 3, 5, 6]


def test_replay_advantage_is_checked_against_the_estimator() -> None:
    """Checked when the config is read (the buffer source's registry check)."""
    from replayrl.config.schema import ConfigError

    base = ["method.name=remix", "algorithm.loss_type=mix_ppg"]
    load_config(None, [*base, "method.remix.replay_advantage=stored"])
    with pytest.raises(ConfigError, match="cannot be recomputed"):
        load_config(None, [*base, "method.remix.replay_advantage=recomputed"])
    gae = [*base, "algorithm.advantage=gae"]
    load_config(None, [*gae, "method.remix.replay_advantage=recomputed"])
    with pytest.raises(ConfigError, match="recomputed at every step"):
        load_config(None, [*gae, "method.remix.replay_advantage=stored"])


def test_reincarnation_step_and_share_are_exclusive() -> None:
    with pytest.raises(Exception, match="give one"):
        load_config("remix-grpo", ["method.remix.reincarnation_at=0.3"])  # the preset sets T = 50
    cfg = load_config(
        "remix-grpo", ["method.remix.reincarnation_step=null", "method.remix.reincarnation_at=0.3"]
    )
    assert cfg.method.remix.reincarnation_at == 0.3


def test_normalised_ess_by_hand() -> None:
    import math

    from replayrl.algorithms.losses import clip_stats, normalised_ess

    assert normalised_ess(torch.ones(4)) == pytest.approx(1.0)
    # (1 + 3)^2 / (2 x (1 + 9)) = 0.8
    assert normalised_ess(torch.tensor([1.0, 3.0])) == pytest.approx(0.8)
    # one weight carries everything: 1 / N
    assert normalised_ess(torch.tensor([1.0, 1e-12, 1e-12, 1e-12])) == pytest.approx(0.25)
    assert math.isnan(normalised_ess(torch.tensor([])))
    # fresh tokens (ratios 1, 1) and stale ones (1, 3), split by `stale`
    ratio = torch.tensor([1.0, 1.0, 1.0, 3.0])
    out = clip_stats(ratio, torch.ones(4), torch.tensor([False, False, True, True]), 0.2, 0.2)
    assert out["on_policy/ess"] == pytest.approx(1.0)
    assert out["off_policy/ess"] == pytest.approx(0.8)
