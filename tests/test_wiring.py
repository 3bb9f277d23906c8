"""Wiring: each paper knob reaches the learner and the loop (tests that fail when wired wrong).

The pure functions are tested against hand values elsewhere; these check that the loop and
the learner hand them the right inputs: pi_{k-1} refreshed each step, the Mix-PPG clip
centre passed in, the entropy bonus's sign, reincarnation switching pi_base and the batch,
GAE advantages whitened, lambda(t)'s step count, UTD passes per batch, the positive-bias
sampler, registries and the data-parallel loss normaliser.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import replayrl.learner.policy_pass as policy_pass_module
from replayrl.algorithms import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    batch_normaliser,
    call_policy_loss,
    get_policy_loss,
    register_policy_loss,
)
from replayrl.config.schema import ConfigError, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.batching import collate, unpad
from replayrl.learner.context import Ranks
from replayrl.learner.critic import ValueModel
from replayrl.learner.learner import Learner, token_logprobs
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.run.loops.auto import resolve_design
from replayrl.run.loops.sync import sync_step
from replayrl.run.metrics import Progress, read_metrics
from replayrl.run.session import Session
from replayrl.run.start import train
from tiny import tiny_config


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def rollouts(tiny_model, char_tokenizer) -> list[Rollout]:
    gen = HFGenerator(tiny_model, char_tokenizer)
    torch.manual_seed(3)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5))
    rng = np.random.default_rng(1)
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


def _learner(model, pad_id: int, *overrides: str, critic=None) -> Learner:
    cfg = load_config(None, ["rollout.prompts_per_step=3", "rollout.num_generations=4", *overrides])
    return Learner(copy.deepcopy(model), pad_id, cfg, critic=critic)


def _flat(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def _record_objective(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Record what the learner hands the objective (it still computes the real loss)."""
    calls: list[dict] = []
    real = policy_pass_module.policy_objective

    def recording(loss_type, logprobs, entropy, old, adv, mask, inputs, knobs, w, normaliser):
        calls.append({"inputs": dict(inputs), "adv": adv, "mask": mask, "old": old, "weights": w})
        return real(loss_type, logprobs, entropy, old, adv, mask, inputs, knobs, w, normaliser)

    monkeypatch.setattr(policy_pass_module, "policy_objective", recording)
    return calls


# -- the learner ------------------------------------------------------------------------------
def test_previous_policy_is_refreshed_every_step(rollouts, tiny_model, char_tokenizer) -> None:
    # lambda(t) = 0.5 from t = 1 on: KL to pi_{k-1} is on at every step
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "kl.beta=0.1",
        "kl.target=convex",
        "kl.schedule.start=0",
        "kl.schedule.every=1",
        "kl.schedule.decrement=0.5",
        "train.lr=0.01",
    )
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        before = _flat(learner.model)
        learner.train_step(rollouts, rng, step=step)
        # the policy this step started from is the next step's pi_{k-1}
        assert learner.prev_model is not None
        assert torch.equal(_flat(learner.prev_model), before), step
        assert not torch.equal(_flat(learner.model), before)  # the policy moved


def test_mix_ppg_receives_the_clip_centre_of_stale_rollouts(
    rollouts, tiny_model, char_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, "algorithm.loss_type=mix_ppg")
    learner.version = 1
    # half the batch from an older behaviour policy (log-probs shifted: pi_beh != pi_k)
    batch = [copy.copy(r) for r in rollouts]
    for i, r in enumerate(batch):
        if i % 2 == 0:
            r.behaviour_logprobs = r.behaviour_logprobs - 0.3
        else:
            r.policy_version = 1
    stale = [r.policy_version < 1 for r in batch]
    calls = _record_objective(monkeypatch)
    current = token_logprobs(learner.model, collate(batch, learner.pad_id), 1.0)[0].detach()
    learner.train_step(batch, np.random.default_rng(0), step=1)  # stale: by version
    anchor = calls[0]["inputs"]["anchor_logprobs"]
    assert anchor is not None, "Mix-PPG's clip centre pi_k / pi_beh was not passed in"
    mask = calls[0]["mask"].bool()
    old = calls[0]["old"]
    # one mini-batch, one micro-batch, shuffled: match rows by their behaviour log-probs
    full = collate(batch, learner.pad_id)
    for row in range(len(batch)):
        j = next(i for i in range(len(batch)) if torch.equal(full.old_logprobs[i], old[row]))
        m = mask[row]
        if stale[j]:  # c = pi_k / pi_beh: anchor = log pi_k at the start of the step
            assert torch.allclose(anchor[row][m], current[j][m], atol=1e-5)
            assert not torch.allclose(anchor[row][m], old[row][m])
        else:  # fresh: c = 1
            assert torch.equal(anchor[row][m], old[row][m])


def _mean_entropy(learner: Learner, batch: list[Rollout]) -> float:
    b = collate(batch, learner.pad_id)
    with torch.no_grad():
        _, ent = token_logprobs(learner.model, b, 1.0)
    return float((ent * b.mask).sum() / b.mask.sum())


def test_entropy_bonus_raises_entropy(rollouts, tiny_model, char_tokenizer) -> None:
    # zero advantages and no KL: the bonus -c H is the only gradient
    batch = [copy.copy(r) for r in rollouts]
    for r in batch:
        r.advantage = 0.0
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "algorithm.entropy_coef=1.0",
        "train.lr=0.01",
        "train.max_grad_norm=null",
    )
    before = _mean_entropy(learner, batch)
    for step in range(3):
        learner.train_step(batch, np.random.default_rng(step), step=step + 1)
    assert _mean_entropy(learner, batch) > before + 1e-3


def test_gae_advantages_reach_the_loss_whitened(
    rollouts, tiny_model, char_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    critic = ValueModel(copy.deepcopy(tiny_model.model), tiny_model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # non-trivial values
    learner = _learner(
        tiny_model, char_tokenizer.pad_token_id, "algorithm.advantage=gae", critic=critic
    )
    calls = _record_objective(monkeypatch)
    learner.train_step(rollouts, np.random.default_rng(0), step=1)
    adv, mask = calls[0]["adv"], calls[0]["mask"].bool()
    assert adv.shape == mask.shape  # per-token GAE, not the stored per-sequence advantage
    vals = adv[mask]
    assert abs(float(vals.mean())) < 1e-5
    assert float(vals.std()) == pytest.approx(1.0, abs=1e-4)


def test_gae_returns_carry_the_outcome_reward_from_the_last_token(
    rollouts, tiny_model, char_tokenizer
) -> None:
    # a fresh critic's head is zero, so V = 0 everywhere and, with lam = 1, the return at
    # token t of a completion of c tokens is gamma^(c - 1 - t) * reward: the outcome reward
    # sits on the last completion token and is discounted backwards from there
    critic = ValueModel(copy.deepcopy(tiny_model.model), tiny_model.config.hidden_size)
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "algorithm.advantage=gae",
        "critic.gamma=0.5",
        "critic.lam=1.0",
        critic=critic,
    )
    assert learner.critic_pass is not None
    b, lengths = learner.assembly.collate(rollouts)
    b = learner.critic_pass.gae_fields(rollouts, b, lengths)
    returns, values = unpad(b.returns, b.mask), unpad(b.old_values, b.mask)
    assert any(r.reward for r in rollouts) and len(returns) == len(rollouts)
    for r, ret, v in zip(rollouts, returns, values, strict=True):
        c = r.completion_ids.numel()
        assert torch.equal(v, torch.zeros(c))
        expected = r.reward * 0.5 ** torch.arange(c - 1, -1, -1, dtype=torch.float32)
        assert torch.allclose(ret, expected, atol=1e-6)


def test_reincarnation_sets_base_to_the_current_policy(
    rollouts, tiny_model, char_tokenizer
) -> None:
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, "kl.beta=0.1", "train.lr=0.01")
    initial = _flat(learner.model)
    learner.train_step(rollouts, np.random.default_rng(0), step=1)
    assert torch.equal(_flat(learner.base_model), initial)
    learner.reincarnate()
    moved = _flat(learner.model)
    assert not torch.equal(moved, initial)
    assert torch.equal(_flat(learner.base_model), moved)


# -- the loop ---------------------------------------------------------------------------------
def _session(tmp_path: Path, *extra: str) -> Session:
    cfg = tiny_config(tmp_path, "train.threads=1", "train.steps=4", *extra)
    run_dir = tmp_path / cfg.logging.name
    run_dir.mkdir(parents=True)
    return Session(cfg, run_dir, log=quiet)


def _step(s: Session) -> None:
    sync_step(s, Progress(s.cfg.train.steps, s.counters.step, False))


REMIX = [
    "method.name=remix",
    "algorithm.loss_type=mix_ppg",
    "method.remix.off_policy_fraction=0.5",
    "method.remix.num_policies=2",
    "method.remix.utd=2",
    "method.remix.utd_after=1",
    "method.remix.reincarnation_step=2",
    # R fresh + p / (1 - p) R stale (the counts asserted below)
    "method.remix.composition=additive",
    "kl.beta=0.01",
    "kl.target=convex",
    # the policy must move for pi_T to differ from the initial policy: an entropy bonus
    # moves it even when every group's rewards are equal (zero advantages)
    "algorithm.entropy_coef=0.1",
    "train.lr=0.01",
]


def test_remix_mixes_then_reincarnates_with_utd_passes(tmp_path: Path) -> None:
    s = _session(tmp_path, *REMIX)
    initial = _flat(s.learner.model)
    try:
        updates, base_at_T = [], None
        for step in range(4):
            before = s.learner.updates
            if step == 2:
                base_at_T = _flat(s.learner.model)  # pi_T
            _step(s)
            updates.append(s.learner.updates - before)
        # m = 2 passes per batch before T, utd_after = 1 from T on
        assert updates == [2, 2, 1, 1]
        assert s.counters.reincarnation_step == 2
        assert s.source.window is None  # type: ignore[union-attr]
        assert base_at_T is not None and not torch.equal(base_at_T, initial)
        assert torch.equal(_flat(s.learner.base_model), base_at_T)  # pi_base <- pi_T
        s.metrics.close()
        rows = {r["step"]: r for r in read_metrics(s.run_dir / "metrics.jsonl")}
        # step 2 replays the window (1 - p fresh, p stale); after T only fresh rollouts
        # R = 8 fresh; p = 0.5: as many replayed (the window is empty at step 1)
        assert [rows[t]["batch/batch_size"] for t in (1, 2, 3, 4)] == [8, 16, 8, 8]
        assert rows[2]["train/off_policy/tokens"] > 0
        for step in (3, 4):
            assert rows[step]["train/off_policy/tokens"] == 0
    finally:
        s.metrics.close()


def test_epochs_and_mini_batches_give_that_many_updates(tmp_path: Path) -> None:
    s = _session(tmp_path, "train.epochs=3", "train.mini_batch_size=4")  # R = B = 8
    try:
        _step(s)
        assert s.learner.updates == 3 * 2
    finally:
        s.metrics.close()


def test_positive_bias_sampler_reaches_the_loop(tmp_path: Path) -> None:
    s = _session(
        tmp_path,
        "method.name=replay",
        "buffer.capacity=16",
        "buffer.sampler=positive_bias",
        "buffer.delta=0.5",
    )
    try:
        assert s.buffer.sampler.name == "positive_bias"
        assert s.buffer.reserve_capacity == 8  # floor(delta N)
    finally:
        s.metrics.close()


def test_kl_lambda_counts_steps_from_one(tmp_path: Path) -> None:
    # lambda(t) = max(1 - 0.1 ceil(max(t - 1, 0) / 1), 0.5): t = 1, 2, 3 -> 1.0, 0.9, 0.8
    cfg = tiny_config(
        tmp_path,
        "train.threads=1",
        "train.steps=3",
        "kl.beta=0.01",
        "kl.target=convex",
        "kl.schedule.start=1",
        "kl.schedule.every=1",
    )
    train(cfg, log=quiet)
    rows = read_metrics(tmp_path / cfg.logging.name / "metrics.jsonl")
    lams = [r["train/kl_lambda"] for r in rows if "train/kl_lambda" in r]
    assert lams == pytest.approx([1.0, 0.9, 0.8])


def test_auto_design_returns_a_new_config() -> None:
    cfg = load_config(None, ["method.name=replay", "buffer.capacity=auto", "train.batch_size=auto"])
    new = resolve_design(cfg, 32, 64)
    assert cfg.buffer.capacity == "auto" and cfg.train.batch_size == "auto"  # unchanged
    assert new.buffer.capacity == 32 and new.batch_size == 64
    assert new.buffer.with_replacement  # B > N: the theory's sampling model


# -- registries and aggregations --------------------------------------------------------------
def test_losses_reject_arguments_they_do_not_declare() -> None:
    lp, mask, adv = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    with pytest.raises(TypeError):
        get_policy_loss("grpo_clip")(lp, lp, adv, mask, rewards=adv)  # not a grpo_clip input
    with pytest.raises(TypeError):
        get_policy_loss("grpo_clip")(lp, lp, adv, mask, epsilom=0.2)  # a typo is an error
    # the caller hands a loss only what it declares; a missing declared input is named
    available = {"anchor_logprobs": None, "rewards": adv, "baselines": adv}
    knobs = {
        "epsilon": 0.2,
        "epsilon_high": None,
        "delta_v": -0.1,
        "importance_sampling_level": "token",
    }
    for name in ("grpo_clip", "mix_ppg", "asymre"):
        call_policy_loss(name, lp, lp, adv, mask, available, knobs, "token_mean", None)
    with pytest.raises(ValueError, match="rewards"):
        call_policy_loss("asymre", lp, lp, adv, mask, {}, knobs, "token_mean", None)


def test_config_accepts_what_is_registered() -> None:
    with pytest.raises(ConfigError, match="grpo_clip") as info:
        load_config(None, ["algorithm.loss_type=ppo_kl"])
    assert "mix_ppg" in str(info.value)  # the message lists the registered names
    with pytest.raises(ConfigError, match="dr_grpo"):
        load_config(None, ["algorithm.loss_agg=sum"])
    with pytest.raises(ConfigError, match="gae"):
        load_config(None, ["algorithm.advantage=vtrace"])
    name = "_wiring_test_loss"

    @register_policy_loss(name, knobs=("epsilon",))
    def fn(logprobs, old_logprobs, advantages, mask, *, loss_agg, normaliser, epsilon):
        return aggregate(-logprobs * epsilon, mask, loss_agg, normaliser), {}

    try:
        assert load_config(None, [f"algorithm.loss_type={name}"]).algorithm.loss_type == name
    finally:
        POLICY_LOSSES.remove(name)


def test_dr_grpo_divides_by_batch_times_max_length(tiny_model, char_tokenizer, rollouts) -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # sum 10 over B = 2 sequences x L = 8 max completion tokens: a constant, not #tokens
    assert float(aggregate(per_token, mask, "dr_grpo", 2 * 8)) == pytest.approx(10 / 16)
    with pytest.raises(ValueError, match="normaliser"):
        aggregate(per_token, mask, "dr_grpo")
    assert "dr_grpo" in AGGREGATIONS
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "algorithm.loss_agg=dr_grpo",
        "rollout.max_new_tokens=7",
    )
    assert learner.normaliser(rollouts[:5]) == 5 * 7


def test_token_mean_over_ranks_is_the_mean_over_all_tokens() -> None:
    # two data-parallel ranks with 3 and 9 tokens; gradients are averaged over ranks
    g = torch.Generator().manual_seed(0)
    per_rank = [torch.rand(1, 3, generator=g), torch.rand(1, 9, generator=g)]
    masks = [torch.ones(1, 3), torch.ones(1, 9)]
    counts = [3, 9]

    def reduce_sum(count: float) -> float:  # a fake all-reduce: both ranks' counts
        return float(sum(counts))

    losses = [
        aggregate(x, m, "token_mean", batch_normaliser("token_mean", n, 1, 9, reduce_sum, 2))
        for x, m, n in zip(per_rank, masks, counts, strict=True)
    ]
    averaged = sum(float(v) for v in losses) / 2  # what gradient averaging optimises
    every_token = float(torch.cat([x.flatten() for x in per_rank]).mean())
    mean_of_means = sum(float(x.mean()) for x in per_rank) / 2
    assert averaged == pytest.approx(every_token, abs=1e-6)
    assert not math.isclose(every_token, mean_of_means, abs_tol=1e-3)
    # one rank: the plain count
    assert batch_normaliser("token_mean", 3, 1, 9) == 3.0
    assert batch_normaliser("seq_mean", 3, 2, 9, reduce_sum, 1) == 2.0


def test_learner_normaliser_uses_the_rank_reducer(tiny_model, char_tokenizer, rollouts) -> None:
    learner = _learner(tiny_model, char_tokenizer.pad_token_id)
    local = sum(r.completion_ids.numel() for r in rollouts[:4])
    assert learner.normaliser(rollouts[:4]) == local
    learner.join(Ranks(world_size=3, count_reducer=lambda c: 3 * c))  # 3 equal ranks
    assert learner.normaliser(rollouts[:4]) == pytest.approx(local)
    # the other ranks hold 30 more tokens
    learner.join(Ranks(world_size=3, count_reducer=lambda c: c + 30))
    assert learner.normaliser(rollouts[:4]) == pytest.approx((local + 30) / 3)


# -- metrics, state and the pure helpers the learner reports with -----------------------------
def test_clip_stats_and_ess_hand_values() -> None:
    from replayrl.algorithms.losses import clip_stats, importance_ess

    ratio = torch.tensor([1.0, 1.3, 0.7, 1.1])
    centre = torch.tensor([1.0, 1.0, 1.0, 1.2])
    stale = torch.tensor([False, False, True, True])
    out = clip_stats(ratio, centre, stale, 0.2, 0.25)
    # fresh: 1.0 inside [0.8, 1.25], 1.3 outside; stale: 0.7 < 0.8, 1.1 inside [1.0, 1.45]
    assert out["on_policy/ratio_mean"] == pytest.approx(1.15)
    assert out["on_policy/clip_frac"] == pytest.approx(0.5)
    assert out["off_policy/ratio_mean"] == pytest.approx(0.9)
    assert out["off_policy/clip_frac"] == pytest.approx(0.5)
    assert out["on_policy/tokens"] == 2.0 and out["off_policy/tokens"] == 2.0
    none_stale = clip_stats(ratio, centre, torch.zeros(4, dtype=torch.bool), 0.2, 0.2)
    assert math.isnan(none_stale["off_policy/ratio_mean"]) and none_stale["off_policy/tokens"] == 0
    # ESS of weights w = [1, 3]: (1 + 3)^2 / (2 (1 + 9)) = 0.8; equal weights: 1
    assert importance_ess(torch.log(torch.tensor([1.0, 3.0]))) == pytest.approx(0.8)
    assert importance_ess(torch.full((5,), -2.0)) == pytest.approx(1.0)
    assert importance_ess(torch.zeros(0)) == 1.0


def test_first_step_metrics_are_the_on_policy_values(rollouts, tiny_model, char_tokenizer) -> None:
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, "kl.beta=0.1", "train.lr=0.003")
    b = collate(rollouts, learner.pad_id)
    _, ent = token_logprobs(learner.model, b, 1.0)
    entropy = float((ent * b.mask).sum() / b.mask.sum())
    m = learner.train_step(rollouts, np.random.default_rng(0), step=1)
    tokens = float(b.mask.sum())
    # the first on-policy pass: ratios 1 (behaviour log-probs are this policy's), nothing
    # clipped, KL to pi_base (= this policy) 0, every sequence weight equal
    assert m["on_policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["on_policy/clip_frac"] == 0.0 and m["on_policy/tokens"] == tokens
    assert m["off_policy/tokens"] == 0.0
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["ess"] == pytest.approx(1.0, abs=1e-5)
    assert m["kl_to_base"] == pytest.approx(0.0, abs=1e-6)
    assert m["kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert m["entropy"] == pytest.approx(entropy, rel=1e-4)
    assert m["lr"] == 0.003 and m["skipped_updates"] == 0.0 and m["grad_norm"] > 0
    assert m["kl_lambda"] == 1.0 and m["kl_coef_base"] == pytest.approx(0.1)
    assert m["kl_coef_prev"] == 0.0
    assert m["loss"] == pytest.approx(m["policy_loss"] + m["kl_loss"], abs=1e-6)
    assert learner.version == 1 and learner.updates == 1


def test_learner_state_round_trip_continues_identically(
    rollouts, tiny_model, char_tokenizer
) -> None:
    over = (
        "kl.beta=0.1",
        "kl.target=convex",
        "kl.schedule.start=0",
        "kl.schedule.every=1",
        "kl.schedule.decrement=0.3",
        "train.lr=0.01",
    )
    a = _learner(tiny_model, char_tokenizer.pad_token_id, *over)
    a.train_step(rollouts, np.random.default_rng(0), step=1)
    a.train_step(rollouts, np.random.default_rng(1), step=2)
    b = _learner(tiny_model, char_tokenizer.pad_token_id, *over)
    b.model.load_state_dict(a.model.state_dict())
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert (b.version, b.updates) == (a.version, a.updates) == (2, 2)
    assert torch.equal(_flat(b.base_model), _flat(a.base_model))
    assert torch.equal(_flat(b.prev_model), _flat(a.prev_model))
    ma = a.train_step(rollouts, np.random.default_rng(2), step=3)
    mb = b.train_step(rollouts, np.random.default_rng(2), step=3)
    assert torch.equal(_flat(a.model), _flat(b.model))  # optimizer state restored too
    assert ma["loss"] == mb["loss"]
    # a checkpoint without frozen policies drops them
    state = a.state_dict()
    state["prev_model"] = None
    b.load_state_dict(state)
    assert b.prev_model is None


def test_measure_backward_takes_no_step(rollouts, tiny_model, char_tokenizer) -> None:
    learner = _learner(tiny_model, char_tokenizer.pad_token_id)
    before = _flat(learner.model)
    learner.measure_backward(rollouts)
    assert torch.equal(_flat(learner.model), before)
    assert all(p.grad is None for p in learner.model.parameters())
    assert learner.updates == 0 and learner.version == 0


def test_frozen_policies_live_exactly_while_weighted(rollouts, tiny_model, char_tokenizer) -> None:
    # lambda(t): 1, 1, 0.5, 0 for t = 1..4 -> pi_{k-1} needed from t = 3, pi_base until t = 3
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "kl.beta=0.1",
        "kl.target=convex",
        "kl.schedule.start=2",
        "kl.schedule.every=1",
        "kl.schedule.decrement=0.5",
        "kl.schedule.floor=0.0",
        "train.lr=0.01",
        "algorithm.entropy_coef=0.1",  # the policy moves even with equal rewards
    )
    rng = np.random.default_rng(0)
    initial = _flat(learner.model)
    learner.train_step(rollouts, rng, step=1)
    assert learner.prev_model is None  # t = 2 puts no weight on pi_{k-1}
    assert torch.equal(_flat(learner.base_model), initial)
    for step in (2, 3):
        before = _flat(learner.model)
        learner.train_step(rollouts, rng, step=step)
        assert torch.equal(_flat(learner.prev_model), before), step
        assert torch.equal(_flat(learner.base_model), initial), step  # weighted at t + 1
    before = _flat(learner.model)
    learner.train_step(rollouts, rng, step=4)
    assert learner.base_model is None  # lambda = 0 from t = 4 on: pi_base dropped
    assert torch.equal(_flat(learner.prev_model), before)


def _critic_learner(tiny_model, pad_id: int, *extra: str, head_seed: int = 0) -> Learner:
    critic = ValueModel(copy.deepcopy(tiny_model.model), tiny_model.config.hidden_size)
    torch.manual_seed(head_seed)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # non-trivial values
    over = ("algorithm.advantage=gae", "train.lr=0.01", "critic.lr=0.01", *extra)
    return _learner(tiny_model, pad_id, *over, critic=critic)


def test_critic_state_round_trip_continues_identically(
    rollouts, tiny_model, char_tokenizer
) -> None:
    pad = char_tokenizer.pad_token_id
    a = _critic_learner(tiny_model, pad)
    a.train_step(rollouts, np.random.default_rng(0), step=1)
    a.train_step(rollouts, np.random.default_rng(1), step=2)
    state = copy.deepcopy(a.state_dict())
    assert {"critic", "critic_optimizer"} <= set(state)
    b = _critic_learner(tiny_model, pad, head_seed=1)  # another critic head
    assert b.critic is not None and a.critic is not None
    assert not torch.equal(_flat(b.critic), _flat(a.critic))
    b.model.load_state_dict(a.model.state_dict())
    b.load_state_dict(state)
    assert torch.equal(_flat(b.critic), _flat(a.critic))  # a resumed PPO run keeps its critic
    ma = a.train_step(rollouts, np.random.default_rng(2), step=3)
    mb = b.train_step(rollouts, np.random.default_rng(2), step=3)
    assert torch.equal(_flat(a.critic), _flat(b.critic))  # and its optimizer state
    assert ma["value_loss"] == mb["value_loss"]


def test_critic_metrics_and_step_do_not_depend_on_micro_batching(
    rollouts, tiny_model, char_tokenizer
) -> None:
    pad = char_tokenizer.pad_token_id
    whole = _critic_learner(tiny_model, pad, "train.micro_batch_size=12")
    parts = _critic_learner(tiny_model, pad, "train.micro_batch_size=5")
    mw = whole.train_step(rollouts, np.random.default_rng(0), step=1)
    mp = parts.train_step(rollouts, np.random.default_rng(0), step=1)
    for k in ("value_loss", "value_mse", "value_clip_frac"):
        assert mp[k] == pytest.approx(mw[k], rel=1e-5, abs=1e-7), k
    assert mw["value_loss"] > 0 and mw["value_mse"] > 0
    assert whole.critic is not None and parts.critic is not None
    # micro-batches grouped by prompt (batching.shared_prompt_order) change the order in which
    # gradients are summed: equal up to float rounding
    assert torch.allclose(_flat(whole.critic), _flat(parts.critic), atol=1e-5)


def test_critic_gradients_reach_the_grad_hook(rollouts, tiny_model, char_tokenizer) -> None:
    learner = _critic_learner(tiny_model, char_tokenizer.pad_token_id)
    seen: list[list[torch.nn.Parameter]] = []
    learner.join(Ranks(grad_hook=seen.append))  # data-parallel learners all-reduce through it
    learner.train_step(rollouts, np.random.default_rng(0), step=1)
    assert learner.critic is not None
    critic_ids = [id(p) for p in learner.critic.parameters()]
    assert any([id(p) for p in params] == critic_ids for params in seen)


def test_reincarnation_without_kl_keeps_no_frozen_copy(rollouts, tiny_model, char_tokenizer):
    learner = _learner(tiny_model, char_tokenizer.pad_token_id, "kl.beta=0.0")
    learner.reincarnate()
    assert learner.base_model is None  # no KL term: no pi_base copy held in memory


def _frozen_fields(
    learner: Learner, rollouts: list[Rollout], stale: list[bool], step: int
) -> dict[str, list[torch.Tensor]]:
    """The fields a step's frozen pass adds to its padded batch, per rollout."""
    b, lengths = learner.assembly.collate(rollouts)
    before = set(b.tensors())
    after = learner.frozen.fields(rollouts, b, lengths, stale, step).tensors()
    return {k: unpad(v, b.mask) for k, v in after.items() if k not in before}


def test_frozen_forwards_run_only_for_terms_that_weigh(rollouts, tiny_model, char_tokenizer):
    # each frozen forward costs a full pass over the batch: only the weighted ones run
    pad, n = char_tokenizer.pad_token_id, len(rollouts)
    no_kl = _learner(tiny_model, pad, "kl.beta=0.0")
    assert set(_frozen_fields(no_kl, rollouts, [True] * n, step=1)) == {"stale"}
    assert no_kl.base_model is None and no_kl.prev_model is None
    base_only = _learner(tiny_model, pad, "kl.beta=0.1", "kl.target=reference")
    assert set(_frozen_fields(base_only, rollouts, [False] * n, step=1)) == {
        "base_logprobs",
        "stale",
    }
    assert base_only.prev_model is None
    convex = _learner(
        tiny_model,
        pad,
        "kl.beta=0.1",
        "kl.target=convex",
        "kl.schedule.start=0",
        "kl.schedule.every=1",
        "kl.schedule.decrement=0.3",
        "algorithm.loss_type=mix_ppg",
    )
    fields = _frozen_fields(convex, rollouts, [False] * (n - 1) + [True], step=1)
    assert set(fields) == {"anchor_logprobs", "base_logprobs", "prev_logprobs", "stale"}
    # mix_ppg's anchor only for stale data: fresh rollouts keep their behaviour log-probs
    assert torch.equal(fields["anchor_logprobs"][0], rollouts[0].behaviour_logprobs)
