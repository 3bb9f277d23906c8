"""Wiring of truncated IS (precision.truncated_is_cap) into the learner's GRPO step."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import Learner
from replayrl.rollout.generation import HFGenerator, SamplingParams

BASE = [
    "rollout.prompts_per_step=2",
    "rollout.num_generations=2",
    "algorithm.loss_type=grpo_clip",
    "algorithm.loss_agg=token_mean",
    "train.lr=1e-6",
]


def _rollouts(model, tok) -> list[Rollout]:
    torch.manual_seed(2)
    samples = HFGenerator(model, tok, 8).generate(
        ["1+2=", "12+34="], 2, SamplingParams(max_new_tokens=5)
    )
    return [
        Rollout(
            prompt_ids=s.prompt_ids,
            completion_ids=s.completion_ids,
            behaviour_logprobs=s.logprobs,
            reward=0.0,
            advantage=[1.0, -1.0, 0.5, -0.5][i],
            correct=False,
            group_id=s.prompt_index,
            policy_version=0,
            step=0,
        )
        for i, s in enumerate(samples)
    ]


def _step(model, tok, batch: list[Rollout], extra: list[str]) -> dict[str, float]:
    cfg = load_config(None, [*BASE, *extra])
    learner = Learner(copy.deepcopy(model), tok.pad_token_id, cfg)
    return learner.train_step(batch, np.random.default_rng(0))


def test_tis_weights_the_first_update(tiny_model, char_tokenizer):
    """fp32 sampler = learner, except rollout 0 whose sampler log-probs are made log 2
    lower: its tokens get weight min(2, C), every other token 1. On the first update the
    ratio is 1, so token_mean grpo_clip's loss is -sum_t w_t A_t / N (by hand below)."""
    rollouts = _rollouts(tiny_model, char_tokenizer)
    rollouts[0].behaviour_logprobs = rollouts[0].behaviour_logprobs - math.log(2.0)
    lens = [r.completion_ids.numel() for r in rollouts]
    adv = [r.advantage for r in rollouts]
    n = sum(lens)
    recompute = ["precision.recompute_behaviour_logprobs=always"]
    plain = _step(tiny_model, char_tokenizer, copy.deepcopy(rollouts), recompute)
    want_plain = -sum(a * k for a, k in zip(adv, lens, strict=True)) / n
    assert plain["policy_loss"] == pytest.approx(want_plain)
    for cap, w0 in ((2.0, 2.0), (1.5, 1.5)):
        m = _step(
            tiny_model,
            char_tokenizer,
            copy.deepcopy(rollouts),
            [*recompute, f"precision.truncated_is_cap={cap}"],
        )
        weights = [w0] + [1.0] * 3
        want = -sum(w * a * k for w, a, k in zip(weights, adv, lens, strict=True)) / n
        assert m["policy_loss"] == pytest.approx(want, abs=1e-4)
        assert m["tis/mean_weight"] == pytest.approx(
            sum(w * k for w, k in zip(weights, lens, strict=True)) / n, abs=1e-4
        )
        if cap == 1.5:  # rollout 0's tokens (ratio 2) are truncated, the others (ratio 1) not
            assert m["tis/truncated_share"] == pytest.approx(lens[0] / n)


def test_tis_needs_the_learners_logprobs_and_advantages(tiny_model, char_tokenizer):
    with pytest.raises(ValueError, match="recompute_behaviour_logprobs"):
        Learner(
            copy.deepcopy(tiny_model),
            0,
            load_config(None, [*BASE, "precision.truncated_is_cap=2.0"]),
        )
    with pytest.raises(ValueError, match="asymre"):
        Learner(
            copy.deepcopy(tiny_model),
            0,
            load_config(
                None,
                [
                    *BASE[:2],
                    "algorithm.loss_type=asymre",
                    "precision.recompute_behaviour_logprobs=always",
                    "precision.truncated_is_cap=2.0",
                ],
            ),
        )


def test_sequence_truncate_weights_each_row_by_its_own_product(tiny_model, char_tokenizer):
    """importance_sampling_mode=sequence_truncate: one weight per sequence, the product of
    its own token ratios (capped), never one ratio over the padded batch. Rollout 0's sampler
    log-probs are log 1.1 lower per token (weight 1.1^len0), rollout 1's log 1.2 higher
    (weight 1.2^-len1), the others equal (weight 1); the cap (100) binds none."""
    rollouts = _rollouts(tiny_model, char_tokenizer)
    rollouts[0].behaviour_logprobs = rollouts[0].behaviour_logprobs - math.log(1.1)
    rollouts[1].behaviour_logprobs = rollouts[1].behaviour_logprobs + math.log(1.2)
    lens = [r.completion_ids.numel() for r in rollouts]
    assert lens[0] > 1 and lens[1] > 1  # a product over several tokens
    adv = [r.advantage for r in rollouts]
    n = sum(lens)
    m = _step(
        tiny_model,
        char_tokenizer,
        copy.deepcopy(rollouts),
        [
            "precision.recompute_behaviour_logprobs=always",
            "precision.truncated_is_cap=100",
            "precision.importance_sampling_mode=sequence_truncate",
        ],
    )
    weights = [1.1 ** lens[0], 1.2 ** -lens[1], 1.0, 1.0]
    want = -sum(w * a * k for w, a, k in zip(weights, adv, lens, strict=True)) / n
    assert m["policy_loss"] == pytest.approx(want, abs=1e-4)
    mean = sum(w * k for w, k in zip(weights, lens, strict=True)) / n
    assert m["tis/mean_weight"] == pytest.approx(mean, abs=1e-4)
    assert m["tis/truncated_share"] == 0.0
