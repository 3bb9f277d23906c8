"""Groups as buffer items (data/groups.py), TRL's scored group store (data/buffer/scored_groups.py)
and the group batch sources (data/group_sources.py): DAPO's dynamic sampling (arXiv
2503.14476) and TRL's former GRPO-with-replay-buffer. Values are hand-computed; the ledger
checks use the run's real Counters and on-policy queue."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.buffer.scored_groups import ScoredGroupBuffer, trl_group_score
from replayrl.data.groups import Group, reward_std, split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.buffer import BufferSource
from replayrl.methods.group_sources import (
    DynamicSamplingConfig,
    DynamicSamplingSource,
    GroupReplayConfig,
    GroupReplaySource,
    select_signal_groups,
)
from replayrl.run.state import Counters, ledger


def ro(gid: int, reward: float, adv: float = 0.0, version: int = 0, prompt: str = "") -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([3, 4, 5]),
        behaviour_logprobs=torch.zeros(3),
        reward=reward,
        advantage=adv,
        correct=reward > 0.5,
        group_id=gid,
        policy_version=version,
        step=0,
        prompt_text=prompt or f"q{gid}",
    )


def grp(gid: int, rewards: list[float], version: int = 0) -> list[Rollout]:
    """A group with GRPO advantages (r - mean) / std, as the producer stores them."""
    s = reward_std(rewards)
    m = sum(rewards) / len(rewards)
    return [ro(gid, r, (r - m) / (s + 1e-6) if s else 0.0, version) for r in rewards]


# -- groups ----------------------------------------------------------------------------------


def test_reward_std_is_the_unbiased_sample_std() -> None:
    # mean 0.5; squared deviations 4 x 0.25 = 1; / (n - 1) = 1/3
    assert reward_std([1, 0, 0, 1]) == pytest.approx(math.sqrt(1 / 3))
    assert reward_std([1.0]) == 0.0 and reward_std([0.3, 0.3, 0.3]) == 0.0


def test_split_groups_keeps_order_and_rejects_mixed_ids() -> None:
    rs = [ro(7, 1.0), ro(3, 0.0), ro(7, 0.0), ro(3, 0.0)]
    gs = split_groups(rs)
    assert [g.group_id for g in gs] == [7, 3]
    assert gs[0].rollouts == [rs[0], rs[2]] and gs[0].num_correct == 1
    assert gs[0].has_signal() and not gs[1].has_signal()
    with pytest.raises(ValueError, match="share one group_id"):
        Group([ro(1, 0.0), ro(2, 0.0)])
    with pytest.raises(ValueError, match="at least one"):
        Group([])


# -- TRL's scored group store ----------------------------------------------------------------


def test_trl_score_is_std_times_sum_of_absolute_advantages() -> None:
    # rewards 1,0,0,0: mean 0.25, std sqrt(0.75 / 3) = 0.5, advantages 1.5, -0.5 x 3
    g = Group(grp(0, [1, 0, 0, 0]))
    assert g.reward_std == pytest.approx(0.5)
    assert trl_group_score(g) == pytest.approx(0.5 * 3.0, rel=1e-5)
    assert trl_group_score(Group(grp(1, [1, 1, 1, 1]))) == 0.0


def _g(gid: int) -> Group:
    return Group(grp(gid, [1, 0]))


def test_store_keeps_the_best_scores_and_replaces_the_lowest() -> None:
    b = ScoredGroupBuffer(2, seed=0)
    b.add([_g(1), _g(2), _g(3)], [1.0, 3.0, 2.0])  # 3rd replaces the lowest (1.0)
    assert sorted(b.scores()) == [2.0, 3.0] and sorted(g.group_id for g in b.groups()) == [2, 3]
    b.add([_g(4), _g(5), _g(6)], [1.5, 0.0, 2.0])  # below the lowest, no signal, a tie: out
    assert sorted(b.scores()) == [2.0, 3.0]
    st = b.stats()
    assert (st["added"], st["replaced"], st["rejected"]) == (3, 1, 3)
    assert sorted(b.probabilities().tolist()) == pytest.approx([0.4, 0.6])


def test_store_samples_by_score_without_replacement_unless_asked_for_more() -> None:
    b = ScoredGroupBuffer(3, seed=1)
    assert b.sample(2) == []  # empty: nothing to replay
    b.add([_g(1), _g(2), _g(3)], [1.0, 1.0, 8.0])
    drawn = b.sample(3)
    assert sorted(g.group_id for g in drawn) == [1, 2, 3]  # n == size: each exactly once
    counts = {1: 0, 2: 0, 3: 0}
    for g in b.sample(20_000):  # n > size: with replacement, p = score / 10
        counts[g.group_id] += 1
    assert counts[3] / 20_000 == pytest.approx(0.8, abs=0.015)
    assert counts[1] / 20_000 == pytest.approx(0.1, abs=0.01)


def test_store_state_round_trip_draws_the_same_groups() -> None:
    b = ScoredGroupBuffer(3, seed=4)
    b.add([_g(1), _g(2), _g(3)], [1.0, 2.0, 3.0])
    b.sample(2)
    again = ScoredGroupBuffer(3, seed=99)
    again.load_state_dict(b.state_dict())
    assert [g.group_id for g in again.sample(5)] == [g.group_id for g in b.sample(5)]
    assert again.stats() == b.stats()
    again.add([_g(9)], [1.5])  # still a valid heap: 1.0 is the one replaced
    assert sorted(again.scores()) == [1.5, 2.0, 3.0]
    with pytest.raises(ValueError, match="capacity"):
        ScoredGroupBuffer(2).load_state_dict(b.state_dict())


# -- DAPO's dynamic sampling -------------------------------------------------------------------


def test_select_signal_groups_keeps_the_first_needed_with_variance() -> None:
    gs = split_groups([*grp(0, [1, 0]), *grp(1, [1, 1]), *grp(2, [0, 1]), *grp(3, [1, 0, 0])])
    kept, no_signal, surplus = select_signal_groups(gs, needed=2)
    assert [g.group_id for g in kept] == [0, 2] and no_signal == 2
    assert [g.group_id for g in surplus] == [3]
    kept, _, _ = select_signal_groups(gs, needed=5, tol=0.6)  # std 0.707 > 0.6 > 0.577
    assert [g.group_id for g in kept] == [0, 2]


@dataclass
class FakeProduction:
    rollouts: list[Rollout]
    generated: int = 0
    tokens: int = 0
    dropped_reward_error: int = 0
    dropped_reward_timeout: int = 0
    skipped_too_long: int = 0
    first_error: str | None = None
    seconds: float = 0.0
    reward_seconds: float = 0.0
    stats: dict = field(default_factory=dict)


class FakeProducer:
    """Each call returns the next scripted list of groups' rewards (2 per group)."""

    def __init__(self, script: list[list[list[float]]]) -> None:
        self.script, self.calls = list(script), []

    def produce(self, version: int, step: int, base: int) -> FakeProduction:
        self.calls.append((version, step, base))
        rewards = self.script.pop(0)
        rs = [r for i, rw in enumerate(rewards) for r in grp(base + i, rw, version)]
        return FakeProduction(rs, generated=len(rs), tokens=3 * len(rs))


def _account_first(c: Counters, fresh: list[Rollout]) -> None:
    c.account(FakeProduction(fresh, generated=len(fresh), tokens=3 * len(fresh)))


def test_dynamic_sampling_generates_until_full_and_counts_every_rollout() -> None:
    producer = FakeProducer([[[1, 1], [0, 1], [1, 0], [0, 1]]])
    src = DynamicSamplingSource(
        OnPolicyQueue(), producer.produce, 3, 4, 1, DynamicSamplingConfig(max_rounds=4)
    )
    c = Counters(step=5)
    src.before_step(None, c, lambda _: None)
    fresh = [*grp(5_000_000, [0, 0]), *grp(5_000_001, [1, 0])]
    _account_first(c, fresh)
    batch, epochs = src.next_batch(fresh, version=2)
    # call 0: one group with variance; call 1 (4 prompts): 3 with variance, 1 kept as surplus
    assert producer.calls == [(2, 5, 5_000_004)]  # step 5, second call: offset 1 x 4 prompts
    assert sorted({r.group_id for r in batch}) == [5_000_001, 5_000_005, 5_000_006]
    assert len(batch) == 6 and epochs == 1
    assert c.count("rollouts_filtered_no_signal") == 4 and c.count("rollouts_filtered_surplus") == 2
    assert (
        c.count("generation_rounds") == 1
        and c.count("short_steps") == 0
        and c.rollouts_generated == 12
    )
    led = ledger(c, src.buffers())
    assert led["balanced"] and led["consumed"] == 6 and led["filtered_no_signal"] == 4


def test_carried_surplus_is_trained_first_next_step_and_stays_in_the_ledger() -> None:
    producer = FakeProducer([[[0, 1], [1, 0], [0, 1]], [[1, 1], [1, 0]]])
    ds = DynamicSamplingConfig(max_rounds=4, carry_surplus=True)
    src = DynamicSamplingSource(OnPolicyQueue(), producer.produce, 2, 3, 1, ds)
    c = Counters(step=0)
    src.before_step(None, c, lambda _: None)
    fresh = grp(0, [0, 0])
    _account_first(c, fresh)
    batch, _ = src.next_batch(fresh, version=0)  # call 1 gives 3 groups: 2 kept, 1 carried
    assert (
        sorted({r.group_id for r in batch}) == [3, 4] and c.count("rollouts_filtered_surplus") == 0
    )
    assert len(src.carried) == 2 and ledger(c, src.buffers())["balanced"]
    saved = src.state_dict()
    c.step = 1
    fresh = grp(1_000_000, [0, 1])
    _account_first(c, fresh)
    batch, _ = src.next_batch(fresh, version=1)  # the carried group first, then one fresh
    assert [r.group_id for r in batch[:2]] == [5, 5] and batch[0].policy_version == 0
    assert {r.group_id for r in batch[2:]} == {1_000_000} and producer.calls[1:] == []
    led = ledger(c, src.buffers())
    assert led["balanced"] and led["consumed"] == 8 and led["in_buffer"] == 0
    again = DynamicSamplingSource(OnPolicyQueue(), None, 2, 3, 1, ds)
    again.load_state_dict(saved)
    assert again.carried is not None and [g.group_id for g in again.carried.groups] == [5]


def test_dynamic_sampling_stops_after_max_rounds_and_trains_on_what_it_has() -> None:
    producer = FakeProducer([[[0, 0]], [[1, 1]]])
    src = DynamicSamplingSource(
        OnPolicyQueue(), producer.produce, 2, 1, 2, DynamicSamplingConfig(max_rounds=3)
    )
    c = Counters()
    src.before_step(None, c, lambda _: None)
    fresh = grp(0, [1, 0])
    _account_first(c, fresh)
    batch, epochs = src.next_batch(fresh, version=0)
    assert len(batch) == 2 and epochs == 2 and producer.script == []
    assert c.count("generation_rounds") == 2 and c.count("short_steps") == 1
    assert ledger(c, src.buffers())["balanced"]


def test_dynamic_sampling_std_tol_decides_which_groups_carry_signal() -> None:
    # std of [1, 0, 0] is 0.577: kept at std_tol 0.5, dropped at 0.6 (no producer: one call)
    kept = []
    for tol in (0.5, 0.6):
        src = DynamicSamplingSource(
            OnPolicyQueue(), None, 1, 1, 1, DynamicSamplingConfig(std_tol=tol)
        )
        c = Counters()
        src.before_step(None, c, lambda _: None)
        fresh = grp(0, [1, 0, 0])
        _account_first(c, fresh)
        batch, _ = src.next_batch(fresh, version=0)
        kept.append(len(batch))
    assert kept == [3, 0]


# -- TRL's group replay -------------------------------------------------------------------------


def _replay(include_current: bool) -> tuple[GroupReplaySource, Counters]:
    gr = GroupReplayConfig(capacity=4, include_current=include_current)
    src = GroupReplaySource(OnPolicyQueue(), ScoredGroupBuffer(4, seed=0), 1, gr)
    c = Counters()
    src.before_step(None, c, lambda _: None)
    return src, c


def test_group_replay_replaces_zero_std_groups_by_stored_ones() -> None:
    src, c = _replay(include_current=False)
    step1 = [*grp(0, [1, 0, 0, 0]), *grp(1, [1, 1, 1, 1])]
    _account_first(c, step1)
    batch, _ = src.next_batch(step1, version=0)  # empty store: the zero-std group stays
    assert (
        sorted(r.group_id for r in batch) == [0] * 4 + [1] * 4 and c.count("rollouts_reused") == 0
    )
    step2 = [*grp(10, [0, 0, 0, 0], 1), *grp(11, [0, 0, 0, 0], 1), *grp(12, [1, 1, 0, 0], 1)]
    _account_first(c, step2)
    batch, _ = src.next_batch(step2, version=1)
    ids = sorted(r.group_id for r in batch)
    assert ids == [0] * 8 + [12] * 4  # only group 0 was stored: drawn twice (n > size)
    assert c.count("rollouts_filtered_no_signal") == 8 and c.count("rollouts_reused") == 8
    stale = [r for r in batch if r.group_id == 0]
    assert all(r.policy_version == 0 and r.times_sampled >= 2 for r in stale)
    led = ledger(c, src.buffers())
    assert led["balanced"] and led["generated"] == 20 and led["consumed"] == 12


def test_group_replay_stores_the_batch_first_as_trl_did() -> None:
    src, c = _replay(include_current=True)
    step1 = [*grp(0, [1, 0, 0, 0]), *grp(1, [1, 1, 1, 1])]
    _account_first(c, step1)
    batch, _ = src.next_batch(step1, version=0)
    assert sorted(r.group_id for r in batch) == [0] * 8  # group 0 also replaces group 1
    assert c.count("rollouts_filtered_no_signal") == 4 and ledger(c, src.buffers())["balanced"]
    state = src.state_dict()
    again, _ = _replay(include_current=True)
    again.load_state_dict(state)
    assert [g.group_id for g in again.store.groups()] == [0]


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["algorithm.advantage=rloo"], "needs algorithm.advantage=grpo"),
        (["train.batch_size=64"], "leave train.batch_size unset"),
        (["runtime=async-local"], "runtime=sync"),
    ],
)
def test_group_sources_reject_settings_they_cannot_honour(extra: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config("dapo", extra)
    with pytest.raises(ConfigError, match=match):
        load_config("group-replay", extra)


def test_presets_carry_dapo_and_trl_defaults() -> None:
    d = load_config("dapo")
    assert d.method.name == "dynamic_sampling" and d.algorithm.epsilon_high == 0.28
    assert d.algorithm.epsilon == 0.2 and d.algorithm.loss_agg == "token_mean"
    assert d.kl.beta == 0.0
    g = load_config("group-replay")
    assert g.method.name == "group_replay" and g.method.group_replay.capacity == 64


def test_default_config_is_on_policy(tmp_path: Path) -> None:
    assert load_config(None).method.name == "onpolicy"


# -- end to end: the CLI and the Python API ---------------------------------------------------


def _summary(run: Path) -> dict:
    import json

    return json.loads((run / "summary.json").read_text())


def test_dapo_trains_through_the_cli_and_counts_extra_calls(tmp_path: Path) -> None:
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    # digits_format: the tiny model's groups differ in it (correctness is all 0 at the start)
    argv = [*TINY_RUN, "train.threads=1", "train.steps=3", f"logging.run_dir={tmp_path}"]
    extra = [
        "method.dynamic_sampling.max_rounds=3",
        "logging.name=dapo",
        "rewards=[{name: digits_format}]",
    ]
    assert main(["train", "--config", "dapo", *argv, *extra]) == 0
    s = _summary(tmp_path / "dapo")
    led = s["accounting"]["ledger"]
    calls = s["steps"] + s["generation_rounds_extra"]
    assert s["steps"] == 3 and led["balanced"] and s["generation_rounds_extra"] >= 1
    # every call generates R = 2 x 4, and all of them are in the ledger
    assert s["rollouts_generated"] == 8 * calls == led["generated"]
    assert led["generated"] == (
        led["consumed"]
        + led["filtered_no_signal"]
        + led["filtered_surplus"]
        + led["dropped_reward_error"]
    )
    # full batches of 2 groups x 4 trained each step (this seed never hits max_rounds)
    assert s["short_steps"] == 0 and led["consumed"] == 3 * 8 and s["tokens_trained"] > 0
    assert led["filtered_no_signal"] + led["filtered_surplus"] > 0


def test_group_replay_trains_and_resumes_through_the_python_api(tmp_path: Path) -> None:
    from replayrl.api.trainer import ReplayConfig, ReplayTrainer
    from tiny import TINY_RUN

    common = [*TINY_RUN, "train.threads=1", "rollout.num_generations=2"]
    common += ["rewards=[{name: digits_format}]"]  # some groups vary, some do not

    def trainer(steps: int) -> ReplayTrainer:
        args = ReplayConfig(
            "group-replay", output_dir=str(tmp_path / "gr"), max_steps=steps, overrides=common
        )
        return ReplayTrainer(args=args, log=lambda _: None)

    first = trainer(2).train()
    assert first["steps"] == 2 and first["accounting"]["ledger"]["balanced"]
    second = trainer(3).train(resume_from_checkpoint=True)  # the group store comes back
    led = second["accounting"]["ledger"]
    assert second["steps"] == 3 and led["balanced"] and led["generated"] == 3 * 4
    assert led["generated"] == led["consumed"] + led["filtered_no_signal"]
    # each replaced group of 2 became a stored group of 2: reused, never generated
    assert second["rollouts_reused"] == led["filtered_no_signal"] > 0


def test_dapo_through_the_api_and_group_replay_through_the_cli(tmp_path: Path) -> None:
    from replayrl.api.trainer import ReplayConfig, ReplayTrainer
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    common = [*TINY_RUN, "train.threads=1", "train.steps=2", "rewards=[{name: digits_format}]"]
    args = ReplayConfig("dapo", output_dir=str(tmp_path / "dapo"), overrides=common)
    assert args.to_config().method.name == "dynamic_sampling"
    s = ReplayTrainer(args=args, log=lambda _: None).train()
    assert s["steps"] == 2 and s["accounting"]["ledger"]["balanced"]
    assert s["rollouts_generated"] == 8 * (2 + s["generation_rounds_extra"])
    argv = [*common, f"logging.run_dir={tmp_path}", "logging.name=gr"]
    assert main(["train", "--config", "group-replay", *argv]) == 0
    g = _summary(tmp_path / "gr")
    assert g["accounting"]["ledger"]["balanced"] and g["rollouts_generated"] == 16
    assert g["generation_rounds_extra"] == 0  # group replay never generates more


def test_config_keys_reach_the_sources() -> None:
    from replayrl.run.components import build_batch_source

    cfg = load_config(
        "dapo",
        ["method.dynamic_sampling.train_prompts=3", "method.dynamic_sampling.max_rounds=5"],
    )
    ds = build_batch_source(cfg, OnPolicyQueue())
    assert isinstance(ds, DynamicSamplingSource)
    assert (ds.train_prompts, ds.prompts_per_call, ds.ds.max_rounds) == (3, 16, 5)
    assert ds.produce is None  # no producer given: trains on the first call's groups
    over = ["method.group_replay.capacity=5", "method.group_replay.include_current=false"]
    gr = build_batch_source(load_config("group-replay", over), OnPolicyQueue())
    assert isinstance(gr, GroupReplaySource)
    assert gr.store.capacity == 5 and not gr.gr.include_current
    assert isinstance(build_batch_source(load_config("grpo"), OnPolicyQueue()), BufferSource)


def test_group_replay_counts_each_replayed_rollout_once_per_epoch() -> None:
    # rollouts_reused counts training passes over replayed rollouts: 4 stored rollouts drawn
    # once, trained for 3 epochs, are 12 reuses
    gr = GroupReplayConfig(capacity=4, include_current=False)
    src = GroupReplaySource(OnPolicyQueue(), ScoredGroupBuffer(4, seed=0), 3, gr)
    c = Counters()
    src.before_step(None, c, lambda _: None)
    src.next_batch(grp(0, [1, 0, 0, 0]), version=0)
    batch, epochs = src.next_batch(grp(1, [0, 0, 0, 0], 1), version=1)
    assert epochs == 3 and [r.group_id for r in batch] == [0] * 4
    assert c.count("rollouts_reused") == 4 * 3


def test_a_group_source_used_before_its_counters_are_bound_says_so() -> None:
    gr = GroupReplayConfig(capacity=4, include_current=False)
    src = GroupReplaySource(OnPolicyQueue(), ScoredGroupBuffer(4, seed=0), 1, gr)
    with pytest.raises(AssertionError, match="before_step binds the counters"):
        src.next_batch(grp(0, [1, 0]), version=0)


def test_zero_std_tol_decides_which_groups_are_replaced() -> None:
    gr = GroupReplayConfig(capacity=4, include_current=False, zero_std_tol=0.6)
    src = GroupReplaySource(OnPolicyQueue(), ScoredGroupBuffer(4, seed=0), 1, gr)
    c = Counters()
    src.before_step(None, c, lambda _: None)
    src.next_batch(grp(0, [1, 0]), version=0)  # std 0.707 > 0.6: stored
    batch, _ = src.next_batch(grp(1, [1, 0, 0]), version=1)  # std 0.577 <= 0.6: replaced
    assert [r.group_id for r in batch] == [0, 0] and c.count("rollouts_filtered_no_signal") == 3


def test_extra_generation_calls_add_their_generation_time_not_reward_time() -> None:
    import time

    def slow(version: int, step: int, base: int) -> FakeProduction:
        time.sleep(0.03)  # 0.03 s in the call, of which 0.01 s "in reward functions"
        rs = grp(base, [1, 0])
        return FakeProduction(rs, generated=2, tokens=6, reward_seconds=0.01)

    src = DynamicSamplingSource(OnPolicyQueue(), slow, 1, 1, 1, DynamicSamplingConfig())
    c = Counters()
    src.before_step(None, c, lambda _: None)
    t0 = time.perf_counter()
    src.next_batch(grp(0, [0, 0]), version=0)
    wall = time.perf_counter() - t0
    assert 0.02 <= c.generation_seconds <= wall - 0.01 + 1e-6
    assert c.reward_seconds == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("dapo", ["method.dynamic_sampling.carry_surplus=true", "rollout.prompts_per_step=4"]),
        ("group-replay", ["rollout.num_generations=2", "rollout.prompts_per_step=6"]),
    ],
)
def test_crash_and_resume_equals_the_uninterrupted_run(
    preset: str, extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sources' state (carried groups, the group store and its RNG) survives a checkpoint:
    a run that crashes after step 3 and resumes from step 2 logs what the whole run logged."""
    from replayrl.storage.checkpoint import latest_checkpoint, load_state
    from tiny import TINY_RUN, crash_and_resume

    over = [*TINY_RUN, "train.threads=1", "checkpoint.every=1", *extra]
    over += ["method.dynamic_sampling.train_prompts=1"]  # dapo: surplus groups to carry
    over += ["rewards=[{name: digits_format}]"]
    held: list[dict] = []

    def look(crashed: Path) -> None:  # step 2's checkpoint has something to restore
        state = load_state(latest_checkpoint(crashed))
        held.append(state["carried_groups"] if preset == "dapo" else state["group_store"])

    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, preset, over, before_resume=look
    )
    assert len(held) == 1 and len(held[0]["sizes"]) >= 2
    assert crash_steps == whole_steps and len(whole_steps) == 4
    for key in ("rollouts_generated", "rollouts_reused", "generation_rounds_extra"):
        assert resumed[key] == whole[key]
    assert resumed["accounting"]["ledger"] == whole["accounting"]["ledger"]


# -- review fixes: limits a group source needs, and what resume may not change ------------------
def test_dynamic_sampling_batch_larger_than_the_queue_is_refused() -> None:
    over = ["buffer.capacity=16", "method.dynamic_sampling.train_prompts=4"]
    over.append("rollout.prompts_per_step=4")
    with pytest.raises(ConfigError, match="smaller than the 32 rollouts"):
        load_config("dapo", [*over, "rollout.num_generations=8"])
    load_config("dapo", [*over, "rollout.num_generations=4"])  # 16 fits


@pytest.mark.parametrize(
    ("preset", "override"),
    [
        ("group-replay", "method.group_replay.capacity=5"),
        ("group-replay", "method.name=none"),
        ("dapo", "method.dynamic_sampling.carry_surplus=true"),
    ],
)
def test_group_state_keys_are_fixed_on_resume(preset: str, override: str) -> None:
    from replayrl.run.records.folder import check_resume_config

    saved = load_config(preset)
    check_resume_config(saved, load_config(preset))  # unchanged: accepted
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        check_resume_config(saved, load_config(preset, [override]))


def test_a_record_without_the_method_keys_resumes_with_their_defaults() -> None:
    from replayrl.run.records.folder import check_resume_config

    saved = load_config("grpo")
    saved_dump = saved.model_dump(mode="json")
    del saved_dump["method"]  # a checkpoint written before the method section existed

    class Old:
        def model_dump(self, mode: str = "json") -> dict:
            return saved_dump

    check_resume_config(Old(), load_config("grpo"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="method.name"):
        check_resume_config(Old(), load_config("group-replay"))  # type: ignore[arg-type]


def test_a_rollout_twice_in_a_batch_is_refreshed_once() -> None:
    from replayrl.learner.pi_old import PiOld, fresh_rollouts

    a, b = grp(0, [1, 0], version=3)
    assert fresh_rollouts([a, b, a, b], 3, PiOld()) == [a, b]


def test_group_replay_composes_with_mix_ppg_replayed_groups_train_off_policy(
    tmp_path: Path,
) -> None:
    # the group-level combination with the seeds' machinery: groups replayed from earlier steps
    # carry their stored version and behaviour log-probs, so Mix-PPG (paper 2) trains them as
    # off-policy tokens, clipped around its centre pi_k / pi_beh, beside the fresh groups
    import json

    from replayrl.cli.main import main
    from tiny import TINY_RUN

    argv = [
        *TINY_RUN,
        "train.threads=1",
        "train.steps=4",
        "rewards=[{name: digits_format}]",
        "algorithm.loss_type=mix_ppg",
        "method.group_replay.include_current=false",  # replacements only from earlier steps
        f"logging.run_dir={tmp_path}",
        "logging.name=gr-mix",
    ]
    assert main(["train", "--config", "group-replay", *argv]) == 0
    s = _summary(tmp_path / "gr-mix")
    assert s["accounting"]["ledger"]["balanced"]
    steps = [
        json.loads(line)
        for line in (tmp_path / "gr-mix" / "metrics.jsonl").read_text().splitlines()
        if '"train/loss"' in line
    ]
    off = [m["train/off_policy/tokens"] for m in steps]
    assert s["rollouts_reused"] > 0 and any(t > 0 for t in off), (s["rollouts_reused"], off)
    assert off[0] == 0  # nothing stored before the first step: the first batch is all fresh
