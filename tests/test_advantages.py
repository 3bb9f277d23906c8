"""The advantage registry is real: the producer calls a registered group estimator at
generation, the learner a registered token estimator at every step; RLOO is registered with
no other edit (arXiv 2402.14740)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import replayrl.learner.policy_pass as policy_pass_module
from replayrl.algorithms import ADVANTAGES
from replayrl.algorithms.advantages import (
    AdvantageSpec,
    group_advantages,
    rloo_advantages,
    whitened_gae,
)
from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.critic import ValueModel
from replayrl.learner.learner import Learner
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.rollout.rewards.scoring import WeightedReward
from replayrl.run.callbacks import RunHooks
from replayrl.run.session import Session
from tiny import tiny_config


def quiet(_: str) -> None:
    pass


# -- RLOO, hand-computed -------------------------------------------------------------------------
def test_rloo_is_the_reward_minus_the_mean_of_the_others() -> None:
    # group 0: r = [1, 0, 0, 1] (G = 4): for r = 1 the others' mean is 1/3 -> A = 2/3;
    # for r = 0 it is 2/3 -> A = -2/3. group 1: r = [3, 1]: A = 3 - 1 = 2 and 1 - 3 = -2.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = rloo_advantages(rewards, groups, scale_rewards=False)
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2.0, -2.0])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_rloo_scaled_divides_by_the_group_std_and_a_lone_sample_gets_zero() -> None:
    # [1, 0, 0, 1]: unbiased std = sqrt(1/3) = 0.57735 -> (2/3) / 0.57735 = 1.1547
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0]), torch.tensor([0, 0, 0, 0, 9]))
    assert torch.allclose(adv[:4], torch.tensor([1.1547, -1.1547, -1.1547, 1.1547]), atol=1e-4)
    assert adv[4] == 0.0  # no other sample in its group: no baseline, no signal


def test_rloo_is_g_over_g_minus_1_times_the_unscaled_grpo_advantage() -> None:
    rewards, groups = torch.tensor([0.2, 0.9, 0.4]), torch.tensor([0, 0, 0])
    grpo, _ = group_advantages(rewards, groups, scale_rewards=False)
    assert torch.allclose(rloo_advantages(rewards, groups, False), grpo * 3 / 2, atol=1e-6)


def test_a_spec_has_exactly_one_estimator() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AdvantageSpec()
    with pytest.raises(ValueError, match="exactly one"):
        AdvantageSpec(group=rloo_advantages, token=whitened_gae)


# -- the producer calls the registered group estimator -------------------------------------------
def _length(prompts: list, completions: list[str], **_: object) -> list[float]:
    """A reward that varies within a group (the tiny model's answers are all wrong)."""
    return [float(len(c)) for c in completions]


def _produced(tmp_path: Path, *overrides: str) -> list[Rollout]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hooks = RunHooks(rewards=[WeightedReward("length", _length)])
    cfg = tiny_config(tmp_path, "train.threads=1", "rollout.max_new_tokens=6", *overrides)
    s = Session(cfg, run_dir, log=quiet, hooks=hooks)
    from tiny import produce_fresh_of

    rollouts, _ = produce_fresh_of(s)
    assert rollouts
    return rollouts


def _reward_groups(rollouts: list[Rollout]) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([r.reward for r in rollouts]),
        torch.tensor([r.group_id for r in rollouts]),
    )


def test_a_run_with_rloo_stores_rloo_advantages(tmp_path: Path) -> None:
    # completion lengths as rewards: groups vary, else every estimator gives 0
    rollouts = _produced(tmp_path, "algorithm.advantage=rloo", "algorithm.scale_rewards=false")
    rewards, groups = _reward_groups(rollouts)
    expected = rloo_advantages(rewards, groups, scale_rewards=False)
    stored = torch.tensor([r.advantage for r in rollouts])
    assert torch.allclose(stored, expected, atol=1e-6)
    grpo, means = group_advantages(rewards, groups, scale_rewards=False)
    assert stored.abs().sum() > 0 and not torch.allclose(stored, grpo)  # not GRPO's values
    assert torch.allclose(torch.tensor([r.group_mean_reward for r in rollouts]), means)


@pytest.fixture
def constant_estimator() -> Iterator[str]:
    name = "test_constant"
    ADVANTAGES.add(name, AdvantageSpec(group=lambda r, g, scale: torch.full_like(r, 0.25)))
    yield name
    ADVANTAGES.remove(name)


def test_a_newly_registered_estimator_is_what_the_producer_stores(
    tmp_path: Path, constant_estimator: str
) -> None:
    rollouts = _produced(tmp_path, f"algorithm.advantage={constant_estimator}")
    assert {r.advantage for r in rollouts} == {0.25}


def test_gae_runs_leave_the_stored_advantage_at_zero(tmp_path: Path) -> None:
    rollouts = _produced(tmp_path, "algorithm.advantage=gae")
    assert {r.advantage for r in rollouts} == {0.0}  # the learner computes it per step


# -- the learner calls the registered token estimator --------------------------------------------
@pytest.fixture
def token_estimator() -> Iterator[tuple[str, list[tuple[float, float]]]]:
    name, calls = "test_token", []

    def constant(rewards, values, mask, gamma, lam):
        calls.append((gamma, lam))
        return torch.full_like(values, 3.0) * mask, values

    ADVANTAGES.add(name, AdvantageSpec(token=constant))
    yield name, calls
    ADVANTAGES.remove(name)


def test_the_learner_calls_the_registered_token_estimator_with_gamma_and_lam(
    tiny_model, char_tokenizer, token_estimator, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, calls = token_estimator
    gen = HFGenerator(tiny_model, char_tokenizer)
    torch.manual_seed(0)
    samples = gen.generate(["1+2=", "3+4="], 2, SamplingParams(max_new_tokens=4))
    batch = [
        Rollout(s.prompt_ids, s.completion_ids, s.logprobs, 1.0, 0.5, True, s.prompt_index, 0, 0)
        for s in samples
    ]
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=2",
            "rollout.num_generations=2",
            f"algorithm.advantage={name}",
            "critic.gamma=0.9",
            "critic.lam=0.7",
        ],
    )
    critic = ValueModel(copy.deepcopy(tiny_model.model), tiny_model.config.hidden_size)
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, cfg, critic=critic)
    seen: list[torch.Tensor] = []
    real = policy_pass_module.policy_objective

    def recording(loss_type, logprobs, entropy, old, adv, mask, *rest):
        seen.append(adv[mask.bool()])
        return real(loss_type, logprobs, entropy, old, adv, mask, *rest)

    monkeypatch.setattr(policy_pass_module, "policy_objective", recording)
    learner.train_step(batch, np.random.default_rng(0), step=1)
    assert calls == [(0.9, 0.7)]
    assert seen and all(torch.all(a == 3.0) for a in seen)  # not the stored 0.5, not GAE


@pytest.mark.parametrize("advantage", ["grpo", "rloo"])
def test_a_group_estimator_with_one_completion_per_prompt_is_refused(advantage: str) -> None:
    from replayrl.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError, match="a group of one completion has advantage 0"):
        load_config(None, [f"algorithm.advantage={advantage}", "rollout.num_generations=1"])
