"""The Learner: micro-batch accumulation, on-policy ratios, update counting, policy improvement."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import Learner, collate, token_logprobs
from replayrl.rollout.generation import HFGenerator, SamplingParams


@pytest.fixture(scope="module")
def rollouts(tiny_model, char_tokenizer) -> list[Rollout]:
    """12 on-policy rollouts of the untrained tiny model with made-up rewards/advantages."""
    gen = HFGenerator(tiny_model, char_tokenizer)
    torch.manual_seed(5)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5))
    rng = np.random.default_rng(0)
    out = []
    for s in samples:
        reward = float(rng.integers(0, 2))
        out.append(
            Rollout(
                prompt_ids=s.prompt_ids,
                completion_ids=s.completion_ids,
                behaviour_logprobs=s.logprobs,
                reward=reward,
                advantage=float(rng.normal()),
                correct=bool(reward),
                group_id=s.prompt_index,
                policy_version=0,
                step=0,
                group_mean_reward=0.5,
            )
        )
    return out


def _learner(model, pad_id: int, *overrides: str) -> Learner:
    cfg = load_config(None, ["rollout.prompts_per_step=3", "rollout.num_generations=4", *overrides])
    return Learner(copy.deepcopy(model), pad_id, cfg)


def _params(learner: Learner) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in learner.model.parameters()])


def _grads(learner: Learner) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in learner.model.parameters()])


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_micro_batches_reproduce_the_full_batch_step(
    rollouts, tiny_model, char_tokenizer, loss_agg: str
):
    pad = char_tokenizer.pad_token_id
    common = ("train.lr=1e-2", f"algorithm.loss_agg={loss_agg}")
    full = _learner(tiny_model, pad, "train.micro_batch_size=64", *common)
    micro = _learner(tiny_model, pad, "train.micro_batch_size=5", *common)  # chunks 5, 5, 2
    m_full = full.train_step(rollouts, np.random.default_rng(0))
    m_micro = micro.train_step(rollouts, np.random.default_rng(0))
    assert m_micro["loss"] == pytest.approx(m_full["loss"], abs=1e-6)
    assert m_micro["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)
    assert m_micro["entropy"] == pytest.approx(m_full["entropy"], rel=1e-5)
    # the accumulated (clipped) gradients agree; they are left on the parameters after the step
    # (weights are not compared: Adam's first step is ~lr * sign(g), which amplifies the
    # float noise of near-zero gradient entries)
    assert torch.allclose(_grads(full), _grads(micro), rtol=1e-4, atol=1e-7)
    initial = torch.cat([p.detach().flatten() for p in tiny_model.parameters()])
    assert (_params(full) - initial).abs().max() > 1e-4  # the step did move the weights


def test_first_on_policy_update_has_unit_ratios(rollouts, tiny_model, char_tokenizer):
    learner = _learner(tiny_model, char_tokenizer.pad_token_id)
    m = learner.train_step(rollouts, np.random.default_rng(0))
    # behaviour log-probs came from these very weights: ratio 1, nothing clipped, KL 0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_frac"] == 0.0
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["skipped_updates"] == 0.0
    assert m["grad_norm"] > 0
    assert m["entropy"] > 0


def test_version_and_update_counts(rollouts, tiny_model, char_tokenizer):
    # 12 rollouts, mini-batches of 5 -> 3 updates per epoch, 2 epochs -> 6 updates per step
    learner = _learner(
        tiny_model, char_tokenizer.pad_token_id, "train.mini_batch_size=5", "train.epochs=2"
    )
    rng = np.random.default_rng(0)
    learner.train_step(rollouts, rng)
    assert (learner.version, learner.updates) == (1, 6)
    learner.train_step(rollouts, rng)
    assert (learner.version, learner.updates) == (2, 12)
    state = learner.optimizer.state_dict()["state"]
    assert all(int(s["step"]) == 12 for s in state.values())
    # the state round-trips into a fresh learner
    other = _learner(tiny_model, char_tokenizer.pad_token_id)
    other.load_state_dict(learner.state_dict())
    assert (other.version, other.updates) == (2, 12)


def _seq_logprob(model, rollout: Rollout, pad_id: int) -> float:
    b = collate([rollout], pad_id)
    with torch.no_grad():
        logps, _ = token_logprobs(model, b, 1.0)
    return float((logps * b.mask).sum())


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_step_moves_logprob_in_the_direction_of_the_advantage(
    rollouts, tiny_model, char_tokenizer, advantage: float
):
    pad = char_tokenizer.pad_token_id
    r = copy.copy(rollouts[0])
    r.advantage = advantage
    learner = _learner(tiny_model, pad, "train.lr=1e-3")
    before = _seq_logprob(learner.model, r, pad)
    learner.train_step([r], np.random.default_rng(0))
    after = _seq_logprob(learner.model, r, pad)
    assert (after - before) * advantage > 0


def test_a_resume_with_a_new_weight_decay_uses_it(tiny_model, char_tokenizer) -> None:
    # the optimizer state restores the saved run's param groups; train.weight_decay changed on
    # resume is accepted, so it must be the value the optimizer uses after loading
    pad = char_tokenizer.pad_token_id
    saved = _learner(tiny_model, pad, "train.weight_decay=0.0").state_dict()
    resumed = _learner(tiny_model, pad, "train.weight_decay=0.1")
    resumed.load_state_dict(saved)
    assert {g["weight_decay"] for g in resumed.optimizer.param_groups} == {0.1}


def test_gradients_are_clipped_to_max_grad_norm(rollouts, tiny_model, char_tokenizer) -> None:
    # the metric reports the norm before clipping; the gradients the optimizer stepped with
    # (left on the parameters) have norm max_grad_norm
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, "train.max_grad_norm=1e-3")
    m = learner.train_step(rollouts, np.random.default_rng(0))
    assert m["grad_norm"] > 1e-2
    assert float(_grads(learner).norm()) == pytest.approx(1e-3, rel=1e-3)


def test_kl_convex_drops_pi_base_once_its_weight_stays_zero(
    rollouts, tiny_model, char_tokenizer
) -> None:
    # lambda(t) = max(1 - ceil(t), 0): 1 at t = 0 (pi_base kept from the start), 0 from step 1,
    # so after step 1 only pi_{k-1} is needed and pi_base's copy is freed
    schedule = {"start": 0, "every": 1, "decrement": 1.0, "floor": 0.0}
    convex = [
        "kl.beta=0.1",
        "kl.target=convex",
        *(f"kl.schedule.{k}={v}" for k, v in schedule.items()),
    ]
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, *convex)
    assert learner.base_model is not None and learner.prev_model is None
    learner.train_step(rollouts, np.random.default_rng(0), step=1)
    assert learner.kl_weights(2) == (0.0, pytest.approx(0.1))
    assert learner.base_model is None and learner.prev_model is not None


def test_a_resumed_learner_keeps_its_kl_reference(rollouts, tiny_model, char_tokenizer) -> None:
    # pi_base is the initial policy, not the weights the run resumes from
    pad = char_tokenizer.pad_token_id
    learner = _learner(tiny_model, pad, "kl.beta=0.1", "train.lr=1e-2")
    learner.train_step(rollouts, np.random.default_rng(0))
    resumed = _learner(learner.model, pad, "kl.beta=0.1", "train.lr=1e-2")
    resumed.load_state_dict(learner.state_dict())
    assert resumed.base_model is not None
    r = rollouts[0]
    initial, trained = _seq_logprob(tiny_model, r, pad), _seq_logprob(learner.model, r, pad)
    assert abs(trained - initial) > 1e-3  # the step moved the policy away from pi_base
    assert _seq_logprob(resumed.base_model, r, pad) == pytest.approx(initial, abs=1e-5)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_masked_truncated_completions_add_no_loss_term(
    rollouts, tiny_model, char_tokenizer, loss_agg: str
) -> None:
    # TRL's mask_truncated_completions: a completion cut at max_new_tokens adds no term. With
    # token_mean the step equals one on the other rollouts alone (its tokens leave the
    # denominator too); with seq_mean (TRL's "grpo") the truncated sequences still count in
    # the number of sequences, as TRL's mean over all of them does
    pad = char_tokenizer.pad_token_id
    marked = [copy.copy(r) for r in rollouts]
    for r in marked[::3]:
        r.truncated = True
    kept = [r for r in marked if not r.truncated]
    common = ("train.lr=1e-2", f"algorithm.loss_agg={loss_agg}")
    masked = _learner(tiny_model, pad, "algorithm.mask_truncated_completions=true", *common)
    masked.train_step(marked, np.random.default_rng(0))
    alone = _learner(tiny_model, pad, *common)
    alone.train_step(kept, np.random.default_rng(0))
    scale = 1.0 if loss_agg == "token_mean" else len(kept) / len(marked)
    assert torch.allclose(_grads(masked), scale * _grads(alone), rtol=1e-4, atol=1e-7)
    # without the option the truncated rollouts are trained on like the others
    plain = _learner(tiny_model, pad, *common)
    plain.train_step(marked, np.random.default_rng(0))
    assert not torch.allclose(_grads(plain), scale * _grads(alone), rtol=1e-3, atol=1e-6)
