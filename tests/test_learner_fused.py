"""The learner's fused log pi_old (fresh rollouts take it from the first update's own forward)
gives the same step as the separate no-grad pass: same loss, gradients, refreshed
log-probs and mismatch metrics; regrouping micro-batches by prompt leaves the step as it is."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import Learner
from tiny import bf16_sampled_rollouts


@pytest.fixture(scope="module")
def rollouts(tiny_model, char_tokenizer) -> list[Rollout]:
    return bf16_sampled_rollouts(tiny_model, char_tokenizer)


def _step(
    model,
    pad: int,
    batch: list[Rollout],
    fuse: bool,
    *overrides: str,
):
    cfg = load_config(
        None,
        [
            "precision.recompute_behaviour_logprobs=always",
            "rollout.prompts_per_step=3",
            "rollout.num_generations=4",
            "train.lr=1e-3",
            "train.micro_batch_size=5",
            *overrides,
        ],
    )
    learner = Learner(copy.deepcopy(model), pad, cfg)
    learner.fuse_behaviour_recompute = fuse
    calls = []  # rows of each separate no-grad pass of the policy
    inner = learner.assembly.logprobs_in

    def spy(model, b, lengths, rows):
        calls.append(len(rows))
        return inner(model, b, lengths, rows)

    learner.assembly.logprobs_in = spy  # type: ignore[method-assign]
    batch = [copy.deepcopy(r) for r in batch]
    metrics = learner.train_step(batch, np.random.default_rng(0))
    return learner, batch, metrics, calls


def _first_moments(learner: Learner) -> list[torch.Tensor]:
    """AdamW's first moments: (1 - beta1) x the gradient after one step, per parameter."""
    state = learner.optimizer.state
    return [state[p]["exp_avg"].clone() for p in learner.model.parameters() if p in state]


@pytest.mark.parametrize("epochs", [1, 2])
def test_fused_equals_separate_pass(tiny_model, char_tokenizer, rollouts, epochs):
    pad = char_tokenizer.pad_token_id
    runs = {}
    for fuse in (True, False):
        runs[fuse] = _step(tiny_model, pad, rollouts, fuse, f"train.epochs={epochs}")
    (lf, bf, mf, cf), (ls, bs, ms, cs) = runs[True], runs[False]
    assert cf == [] and cs == [len(rollouts)]  # the fused step ran no separate pass
    assert mf["behaviour_refreshed"] == ms["behaviour_refreshed"] == len(rollouts)
    for k in ("loss", "policy_loss", "grad_norm", "behaviour_mismatch_mean"):
        assert mf[k] == pytest.approx(ms[k], rel=1e-5, abs=1e-6), k
    assert mf["behaviour_mismatch_max"] > 1e-3  # bf16 sampler vs fp32 learner: refreshed
    assert mf["ratio_max"] == pytest.approx(1.0, abs=1e-5) or epochs > 1
    for a, b, r in zip(bf, bs, rollouts, strict=True):  # the refreshed log pi_old, beside
        assert torch.allclose(lf.pi_old.of(a), ls.pi_old.of(b), atol=1e-5)
        assert torch.equal(a.behaviour_logprobs, r.behaviour_logprobs)  # still the sampler's
        assert torch.equal(b.behaviour_logprobs, r.behaviour_logprobs)
    moments_f, moments_s = _first_moments(lf), _first_moments(ls)
    assert len(moments_f) == len(moments_s) > 0
    for a, b in zip(moments_f, moments_s, strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)
    for a, b in zip(lf.model.parameters(), ls.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_fused_mix_ppg_keeps_fresh_anchors_at_the_refreshed_log_probs(
    tiny_model, char_tokenizer, rollouts
):
    """Mix-PPG over fresh and stale rollouts, two passes over one mini-batch: fresh tokens'
    anchor log pi_k is the refreshed log pi_old in every pass (c = pi_k / pi_beh = 1), so the
    fused refresh trains exactly as the separate pass does. Kept in the sampler's bf16
    values from pass 2 on, c would differ from 1 on fresh tokens and the steps would part."""
    pad = char_tokenizer.pad_token_id
    batch = [copy.deepcopy(r) for r in rollouts]
    stale = [i % 3 == 0 for i in range(len(batch))]
    for r, s in zip(batch, stale, strict=True):
        r.policy_version = -1 if s else 0  # stale: an earlier policy's, never refreshed
    runs = {
        fuse: _step(
            tiny_model,
            pad,
            batch,
            fuse,
            "algorithm.loss_type=mix_ppg",
            "algorithm.epsilon=0.01",  # a band narrower than the bf16 sampler's mismatch
            "train.epochs=2",
        )
        for fuse in (True, False)
    }
    (lf, _, mf, cf), (ls, _, ms, cs) = runs[True], runs[False]
    # the fused step: only the anchor pass; the separate one refreshes the fresh rollouts first
    assert cf == [len(batch)] and cs == [len(batch) - sum(stale), len(batch)]
    assert mf["behaviour_refreshed"] == ms["behaviour_refreshed"] == len(batch) - sum(stale)
    assert mf["clip_frac"] > 0  # the band binds, so its centre matters
    for k in ("loss", "policy_loss", "grad_norm", "clip_frac"):
        assert mf[k] == pytest.approx(ms[k], rel=1e-5, abs=1e-6), k
    for a, b in zip(lf.model.parameters(), ls.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_several_mini_batches_use_the_separate_pass(tiny_model, char_tokenizer, rollouts):
    """After the first mini-batch's update the weights differ from the ones that generated
    the rollouts: log pi_old must come from the pass before any update."""
    pad = char_tokenizer.pad_token_id
    lf, bf, mf, cf = _step(tiny_model, pad, rollouts, True, "train.mini_batch_size=6")
    ls, bs, ms, cs = _step(tiny_model, pad, rollouts, False, "train.mini_batch_size=6")
    assert cf == cs == [len(rollouts)]
    assert mf["loss"] == pytest.approx(ms["loss"], rel=1e-6)
    for a, b in zip(bf, bs, strict=True):
        assert torch.equal(lf.pi_old.of(a), ls.pi_old.of(b))


def test_micro_batch_regrouping_keeps_the_step(tiny_model, char_tokenizer, rollouts):
    """Micro-batches of 1, 5 and all rollouts (each regrouped by prompt) give one update."""
    pad = char_tokenizer.pad_token_id
    runs = [
        _step(tiny_model, pad, rollouts, True, f"train.micro_batch_size={m}") for m in (1, 5, 64)
    ]
    ref = _first_moments(runs[-1][0])
    for learner, _, metrics, _ in runs[:-1]:
        assert metrics["loss"] == pytest.approx(runs[-1][2]["loss"], rel=1e-5)
        for a, b in zip(_first_moments(learner), ref, strict=True):
            assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)
