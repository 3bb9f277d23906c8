"""Groups as buffer items (data/groups.py), TRL's scored group store (data/buffer/groups.py)
and the group batch sources (data/group_sources.py): DAPO's dynamic sampling (arXiv
2503.14476) and TRL's former GRPO-with-replay-buffer. Values are hand-computed; the ledger
checks use the run's real Counters and on-policy queue."""

from __future__ import annotations

import math

import pytest
import torch

from replayrl.data.buffer.groups import ScoredGroupBuffer, trl_group_score
from replayrl.data.groups import Group, QuestionHistory, reward_std, split_groups
from replayrl.data.rollout import Rollout


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


def test_question_history_keeps_the_newest_accuracies() -> None:
    h = QuestionHistory(keep=2)
    for rewards in ([1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]):
        h.update([Group([ro(0, r, prompt="same") for r in rewards])])
    assert h.record["same"] == [0.5, 1.0] and h.latest("same") == 1.0 and h.latest("x") is None
    again = QuestionHistory()
    again.load_state_dict(h.state_dict())
    assert again.record == h.record and again.keep == 2


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
