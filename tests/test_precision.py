"""Precision policy: the oneDNN fp32 switch keeps fp32 accuracy; fresh rollouts get the
learner's own log pi_old; generation-dtype resolution."""

from __future__ import annotations

import copy

import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout import Rollout
from replayrl.learner.learner import collate, token_logprobs, unpad
from replayrl.learner.logprobs import refresh_behaviour_logprobs
from replayrl.models import precision
from replayrl.rollout.generation import HFGenerator, SamplingParams


def _rollout(version: int, logps: list[float]) -> Rollout:
    n = len(logps)
    return Rollout(
        prompt_ids=torch.tensor([5, 6]),
        completion_ids=torch.arange(7, 7 + n),
        behaviour_logprobs=torch.tensor(logps),
        reward=0.0,
        advantage=0.0,
        correct=False,
        group_id=0,
        policy_version=version,
        step=0,
    )


def test_fast_fp32_matmul_keeps_fp32_accuracy():
    try:
        on = precision.enable_fast_fp32_matmul()
        # whether or not this CPU takes the oneDNN path, fp32 matmuls stay fp32-accurate
        assert precision._matmul_error() < 1e-5
        if on:
            assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"
    finally:
        precision.disable_fast_fp32_matmul()
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_generation_and_autocast_dtypes():
    assert precision.generation_dtype("auto", torch.float32) is None
    assert precision.generation_dtype("float32", torch.float32) is None
    assert precision.generation_dtype("bfloat16", torch.float32) == torch.bfloat16
    assert precision.autocast_dtype("none") is None
    assert precision.autocast_dtype("bfloat16") == torch.bfloat16
    cfg = load_config(None, ["precision.generation=bfloat16"])
    assert cfg.precision.learner_autocast == "none" and cfg.precision.fast_fp32_matmul


def test_refresh_replaces_only_fresh_unrefreshed_rollouts():
    fresh = _rollout(3, [-1.0, -2.0])
    stale = _rollout(2, [-0.5])
    calls = []

    def recompute(rs):
        calls.append(len(rs))
        return [r.behaviour_logprobs + 0.1 for r in rs]

    stats = refresh_behaviour_logprobs([fresh, stale], 3, recompute)
    assert calls == [1]
    assert torch.allclose(fresh.behaviour_logprobs, torch.tensor([-0.9, -1.9]))
    assert torch.equal(fresh.extras["sampler_logprobs"], torch.tensor([-1.0, -2.0]))
    assert torch.equal(stale.behaviour_logprobs, torch.tensor([-0.5]))  # untouched
    assert stats["behaviour_refreshed"] == 1 and stats["behaviour_not_refreshed"] == 1
    assert abs(stats["behaviour_mismatch_mean"] - 0.1) < 1e-6
    assert stats["behaviour_ratio_outside"] == 0.0  # exp(0.1) = 1.105 is inside [0.8, 1.2]
    # a second pass (the rollout replayed later) leaves it alone
    stats = refresh_behaviour_logprobs([fresh], 3, recompute)
    assert calls == [1] and stats["behaviour_refreshed"] == 0


def test_bf16_sampler_logprobs_refreshed_to_the_learners(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():  # sharper logits than the random init, so bf16 rounding shows
        model.lm_head.weight.mul_(8)
    gen = HFGenerator(model, char_tokenizer, 16, policy_version=4, dtype=torch.bfloat16)
    torch.manual_seed(0)
    samples = gen.generate(["1+2=", "34+5="], 4, SamplingParams(max_new_tokens=6))
    rollouts = [_rollout(4, [0.0]) for _ in samples]
    for r, s in zip(rollouts, samples, strict=True):
        r.prompt_ids, r.completion_ids, r.behaviour_logprobs = (
            s.prompt_ids,
            s.completion_ids,
            s.logprobs,
        )
    pad = char_tokenizer.pad_token_id

    def recompute(rs):
        b = collate(rs, pad)
        with torch.no_grad():
            lp, _ = token_logprobs(model, b, 1.0)
        return unpad(lp, b["mask"])

    stats = refresh_behaviour_logprobs(rollouts, 4, recompute)
    assert stats["behaviour_mismatch_max"] > 1e-3  # bf16 sampling differs from the fp32 learner
    # afterwards the learner's ratio on fresh data is 1 to fp32 accuracy
    b = collate(rollouts, pad)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b, 1.0)
    m = b["mask"].bool()
    assert float((lp - b["old_logprobs"])[m].abs().max()) < 1e-5


def test_learner_autocast_step_refreshes_fresh_behaviour_logprobs(tiny_model, char_tokenizer):
    """Wiring: with learner_autocast=bfloat16 the learner recomputes log pi_old of fresh
    rollouts in bf16 itself, so its first on-policy update sees ratios of 1."""
    import numpy as np

    from replayrl.learner.learner import Learner

    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    gen = HFGenerator(model, char_tokenizer, 16)
    torch.manual_seed(5)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5))
    rollouts = []
    for i, s in enumerate(samples):
        r = _rollout(0, [0.0])
        r.prompt_ids, r.completion_ids, r.behaviour_logprobs = (
            s.prompt_ids,
            s.completion_ids,
            s.logprobs,
        )
        r.advantage = 1.0 if i % 2 else -1.0
        rollouts.append(r)
    pad = char_tokenizer.pad_token_id
    for refresh, expect_unit in (("never", False), ("auto", True)):
        cfg = load_config(
            None,
            [
                "precision.learner_autocast=bfloat16",
                f"precision.recompute_behaviour_logprobs={refresh}",
                "rollout.prompts_per_step=3",
                "rollout.num_generations=4",
            ],
        )
        batch = [copy.deepcopy(r) for r in rollouts]
        learner = Learner(copy.deepcopy(model), pad, cfg)
        m = learner.train_step(batch, np.random.default_rng(0))
        if expect_unit:
            assert m["behaviour_refreshed"] == len(batch)
            assert m["behaviour_mismatch_max"] > 1e-3  # fp32 sampler vs bf16 learner
            assert m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
            assert all("sampler_logprobs" in r.extras for r in batch)
        else:
            assert "behaviour_refreshed" not in m
            assert m["ratio_max"] > 1.001  # the bf16 learner disagrees with the fp32 sampler
