"""Signal replay (methods/signal_replay.py): the pure rules on hand-computed values, the batch
source's filter, fill, window, use and ESS bounds with scripted groups and a scripted
learner, its checkpoint, and runs through the CLI (budget, counters, ledger, resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.groups import Group
from replayrl.data.rollout_record import Rollout
from replayrl.methods.signal_replay import (
    SignalReplayConfig,
    SignalReplaySource,
    all_right,
    fill_count,
    group_ess,
)
from replayrl.run.state import Counters

STRIDE = 1_000_000


def ro(reward: float, gid: int, version: int, tok: int = 3) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([tok, 4]),
        behaviour_logprobs=torch.full((2,), -0.5),
        reward=reward,
        advantage=reward - 0.5,
        correct=reward > 0.5,
        group_id=gid,
        policy_version=version,
        step=version,
        prompt_text=f"p{gid}",
    )


def fresh(version: int, groups: list[list[int]]) -> list[Rollout]:
    """One step's rollouts: a group per reward list (1 right, 0 wrong)."""
    return [
        ro(float(r), version * STRIDE + j, version, tok=10 * j + i)
        for j, rewards in enumerate(groups)
        for i, r in enumerate(rewards)
    ]


SIG, WRONG, RIGHT = [1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]


class Learner:
    """The learner as the source sees it: a version and current log-probs. `drift(r, v)`: the
    per-token shift of rollout r's log-prob from its behaviour's at version v."""

    def __init__(self, drift=lambda r, v: 0.0, refreshed=lambda r: 0.0) -> None:
        self.version, self.drift, self.refreshed, self.asked = 0, drift, refreshed, 0

    def current_logprobs(self, rollouts):
        self.asked += len(rollouts)
        return [r.behaviour_logprobs + self.drift(r, self.version) for r in rollouts]

    def behaviour_logprobs(self, rollouts):
        # `refreshed(r)`: the learner's own log pi_old of r, off the sampler's by this much
        return [r.behaviour_logprobs + self.refreshed(r) for r in rollouts]


def source(learner: Learner | None = None, **kw) -> tuple[SignalReplaySource, Counters, Learner]:
    src = SignalReplaySource(OnPolicyQueue(), 1, SignalReplayConfig(**kw))
    return src, Counters(), learner or Learner()


def step(src, c, learner, version, groups):
    """One step at `version`: (batch, the replayed rows' versions)."""
    learner.version = c.step = version
    src.before_step(learner, c, lambda _: None)
    batch, passes = src.next_batch(fresh(version, groups), version)
    assert passes == 1
    return batch, [r.policy_version for r in batch if r.policy_version != version]


# -- pure rules ------------------------------------------------------------------------------


def test_fill_count_reaches_the_target_share_of_groups_not_all_right() -> None:
    assert fill_count(1, 8, 0.5) == 3  # 4 wanted
    assert fill_count(4, 8, 0.5) == 0 and fill_count(6, 8, 0.5) == 0
    assert fill_count(1, 7, 0.5) == 3  # ceil(3.5) = 4
    assert fill_count(0, 3, 1.0) == 3
    assert fill_count(0, 0, 1.0) == 0  # every group solved: nothing to fill


def test_all_right_is_a_solved_group_only() -> None:
    g = lambda rs: Group([ro(float(r), 0, 0) for r in rs])  # noqa: E731
    assert all_right(g(RIGHT)) and not all_right(g(WRONG)) and not all_right(g(SIG))


def test_group_ess_by_hand() -> None:
    beh = [torch.zeros(2)] * 2
    assert group_ess([torch.zeros(2), torch.zeros(2)], beh) == pytest.approx(1.0)
    # sequence log-weights 0 and log 3: w = (1, 3): (4)^2 / (2 x 10) = 0.8
    cur = [torch.zeros(2), torch.full((2,), math.log(3) / 2)]
    assert group_ess(cur, beh) == pytest.approx(0.8)


# -- the batch source ------------------------------------------------------------------------


def test_zero_variance_groups_are_dropped_and_counted() -> None:
    src, c, lr = source()
    batch, old = step(src, c, lr, 0, [SIG, WRONG, RIGHT])
    assert [r.group_id for r in batch] == [0] * 4 and old == []
    assert c.count("rollouts_filtered_no_signal") == 8
    assert len(src.store) == 1  # only the signal group is stored
    keep, c2, lr2 = source(train_zero_advantage=True)
    batch, _ = step(keep, c2, lr2, 0, [SIG, WRONG, RIGHT])
    assert len(batch) == 12 and c2.count("rollouts_filtered_no_signal") == 0
    assert len(keep.store) == 1  # zero-variance groups are trained, never stored


def test_fill_engages_below_the_target_and_stops_once_fresh_signal_reaches_it() -> None:
    src, c, lr = source(target=0.5)
    step(src, c, lr, 0, [SIG, SIG, SIG, WRONG])  # 3 stored
    # 4 groups not all right -> 2 wanted; 1 fresh signal -> 1 replayed, the freshest first
    batch, old = step(src, c, lr, 1, [SIG, WRONG, WRONG, WRONG])
    assert old == [0] * 4 and c.count("rollouts_reused") == 4
    assert c.count("signal_fill_steps") == 1
    # the all-right groups call for no fill: 2 not all right -> 1 wanted, 1 fresh
    _, old = step(src, c, lr, 2, [SIG, WRONG, RIGHT, RIGHT])
    assert old == [] and c.count("signal_fill_steps") == 1
    # fresh signal at the target: nothing replayed
    _, old = step(src, c, lr, 3, [SIG, SIG, WRONG, WRONG])
    assert old == [] and c.count("rollouts_reused") == 4
    # below it again: the freshest stored groups (version 3's) come first
    _, old = step(src, c, lr, 4, [WRONG, WRONG, WRONG, WRONG])
    assert old == [3] * 8
    # step 1's replayed rows kept their stored advantages and behaviour log-probs
    assert [r.advantage for r in batch[4:]] == [0.5, -0.5, -0.5, 0.5]
    assert all(torch.equal(r.behaviour_logprobs, torch.full((2,), -0.5)) for r in batch[4:])


def test_target_one_fills_every_missing_group() -> None:
    src, c, lr = source(target=1.0)
    step(src, c, lr, 0, [SIG, SIG, SIG, SIG])
    _, old = step(src, c, lr, 1, [SIG, WRONG, WRONG, WRONG])
    assert len(old) == 3 * 4


def test_window_bounds_the_age_of_a_replayed_group() -> None:
    src, c, lr = source(target=1.0, window=2, max_uses=10)
    step(src, c, lr, 0, [SIG])
    _, old = step(src, c, lr, 2, [WRONG])  # 2 versions old: still in the window
    assert old == [0] * 4
    _, old = step(src, c, lr, 3, [WRONG])  # 3 old: evicted by age, nothing to replay
    assert old == [] and c.count("signal_evicted_age") == 1 and len(src.store) == 0
    assert c.count("signal_skipped_steps") == 1  # nothing at all to train: skipped, counted


def test_max_uses_counts_the_fresh_use() -> None:
    src, c, lr = source(target=1.0, max_uses=3)
    first = fresh(0, [SIG])
    lr.version = c.step = 0
    src.before_step(lr, c, lambda _: None)
    src.next_batch(first, 0)
    uses = [len(step(src, c, lr, v, [WRONG])[1]) for v in (1, 2, 3)]
    assert uses == [4, 4, 0]  # fresh + 2 replays = 3 trainings, then gone
    assert [r.times_sampled for r in first] == [3] * 4
    assert c.count("signal_evicted_uses") == 1 and len(src.store) == 0
    none, c1, lr1 = source(target=1.0, max_uses=1)
    step(none, c1, lr1, 0, [SIG])
    assert len(none.store) == 0 and step(none, c1, lr1, 1, [WRONG])[1] == []


def test_a_group_the_policy_has_moved_away_from_is_evicted_by_ess() -> None:
    # group 1 of step 0: its members' log-probs move apart under the current policy (sequence
    # log-weights 0, 1, 2, 3: ESS 0.52, below 0.9); group 0's stay put (ESS 1)
    def drift(r: Rollout, v: int) -> float:
        return (r.group_id % STRIDE) * (r.completion_ids[0].item() % 10) / 2.0

    lr = Learner(drift)
    src, c, _ = source(lr, target=1.0, min_ess=0.9)
    step(src, c, lr, 0, [SIG, SIG])
    _, old = step(src, c, lr, 1, [WRONG, WRONG])
    assert old == [0] * 4 and c.count("signal_evicted_ess") == 1
    replayed_gid = {r.group_id for r in src.store.items[0].group.rollouts}
    assert replayed_gid == {0} and len(src.store) == 1
    assert lr.asked == 8  # both candidates' log-probs, asked once
    keep, c0, lr0 = source(Learner(drift), target=1.0, min_ess=0.0)
    step(keep, c0, lr0, 0, [SIG, SIG])
    assert len(step(keep, c0, lr0, 1, [WRONG, WRONG])[1]) == 8 and lr0.asked == 0


def test_ess_compares_with_the_learners_log_pi_old_not_the_samplers() -> None:
    # the same spread as above, but it is the sampler's noise: the learner's own log pi_old
    # (recomputed, as the loss's ratio uses it) matches its current log-probs, so ESS is 1
    def spread(r: Rollout) -> float:
        return (r.group_id % STRIDE) * (r.completion_ids[0].item() % 10) / 2.0

    lr = Learner(lambda r, v: spread(r), refreshed=spread)
    src, c, _ = source(lr, target=1.0, min_ess=0.9)
    step(src, c, lr, 0, [SIG, SIG])
    _, old = step(src, c, lr, 1, [WRONG, WRONG])
    assert old == [0] * 8 and c.count("signal_evicted_ess") == 0


def test_the_store_round_trips_through_a_checkpoint() -> None:
    from replayrl.storage.safe_state import dumps, loads

    src, c, lr = source(target=1.0, max_uses=3)
    step(src, c, lr, 0, [SIG, SIG])
    step(src, c, lr, 1, [SIG, WRONG])  # one stored group used twice now
    state = loads(*dumps(src.state_dict()))  # JSON + safetensors, nothing pickled
    twin, c2, lr2 = source(target=1.0, max_uses=3)
    twin.load_state_dict(state)
    assert [(s.uses, s.group.policy_version) for s in twin.store.items] == [
        (s.uses, s.group.policy_version) for s in src.store.items
    ]
    c2.step = c.step
    a = step(src, c, lr, 2, [WRONG, WRONG])[0]
    b = step(twin, c2, lr2, 2, [WRONG, WRONG])[0]
    assert [(r.group_id, r.reward, r.advantage) for r in a] == [
        (r.group_id, r.reward, r.advantage) for r in b
    ]
    # step 1's fresh group, then of step 0's the one used less (least used first in a version)
    assert [r.group_id for r in a[::4]] == [STRIDE, 1]
    assert [s.uses for s in src.store.items] == [s.uses for s in twin.store.items] == [2, 2, 2]


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["train.batch_size=16"], "sizes its own batch"),
        (["buffer.capacity=8"], "smaller than a step's"),
        (["algorithm.loss_type=grpo_clip"], "mix_ppg"),
        (["method.signal_replay.target=1.5"], "target"),
    ],
)
def test_signal_replay_refuses_settings_it_cannot_honour(extra: list[str], match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        load_config("signal-replay-grpo", extra)


def test_config_keys_reach_the_source() -> None:
    from replayrl.run.components import build_batch_source

    over = ["method.signal_replay.target=1.0", "method.signal_replay.window=2"]
    over += ["method.signal_replay.max_uses=3", "method.signal_replay.min_ess=0.25"]
    over += ["method.signal_replay.train_zero_advantage=true"]
    src = build_batch_source(load_config("signal-replay-grpo", over), OnPolicyQueue())
    assert isinstance(src, SignalReplaySource)
    assert (src.sr.target, src.sr.window, src.sr.max_uses) == (1.0, 2, 3)
    assert (src.sr.min_ess, src.sr.train_zero_advantage) == (0.25, True)


# -- end to end ------------------------------------------------------------------------------

# the tiny model is never right on arithmetic; its completions are a clean integer about half
# of the time, so groups scored by that have signal and some do not; target 1: a step with a
# group without signal asks for a fill
SMALL = ["method.signal_replay.target=1.0", "rewards=[{name: digits_format}]"]


def test_signal_replay_trains_through_the_cli_with_grpos_budget(tmp_path: Path) -> None:
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    argv = [*TINY_RUN, "train.threads=1", "train.steps=6", f"logging.run_dir={tmp_path}"]
    argv += ["rollout.prompts_per_step=4", "rollout.num_generations=2", "logging.name=sr"]
    # batches of a varying size in mini-batches of 3 rows: a last, shorter one where it
    # does not divide
    argv += [*SMALL, "train.mini_batch_size=3"]
    assert main(["train", "--config", "signal-replay-grpo", *argv]) == 0
    s = json.loads((tmp_path / "sr" / "summary.json").read_text())
    led = s["accounting"]["ledger"]
    assert s["steps"] == 6 and led["balanced"]
    assert s["rollouts_generated"] == 6 * 8  # GRPO's budget: no extra generation call
    filtered = led["filtered_no_signal"]
    assert led["generated"] == led["consumed"] + filtered and filtered > 0
    assert s["rollouts_reused"] > 0 and s["signal_fill_steps"] > 0
    assert s["evals"][-1]["rollouts_trained"] == led["consumed"] + s["rollouts_reused"]
    with (tmp_path / "sr" / "metrics.jsonl").open() as f:
        rows = [r for r in map(json.loads, f) if "reward/mean" in r]
    ages, sizes = [r["batch/age_max"] for r in rows], [r["batch/batch_size"] for r in rows]
    # every step trained; step 1 had nothing stored, later ones replayed older groups
    assert len(ages) == 6 and ages[0] == 0 and max(ages) >= 1
    assert len(set(sizes)) > 1 and any(n % 3 for n in sizes)  # sizes vary, some not 3k


def test_signal_replay_crash_and_resume_equals_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store (groups, uses, versions) survives a checkpoint: a run that crashes after step
    3 and resumes from step 2 logs what the whole run logged."""
    from tiny import TINY_RUN, crash_and_resume

    common = [*TINY_RUN, "train.threads=1", "checkpoint.every=1", "rollout.prompts_per_step=4"]
    common += ["rollout.num_generations=2"]  # more groups without signal: more fills
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, "signal-replay-grpo", [*common, *SMALL]
    )
    # the first resumed step (3) replays groups stored before the checkpoint of step 2
    assert len(whole_steps) == 4 and whole_steps[2]["batch/age_max"] == 1
    assert crash_steps == whole_steps
    assert resumed["rollouts_reused"] == whole["rollouts_reused"] > 0
    assert resumed["accounting"]["ledger"] == whole["accounting"]["ledger"]
