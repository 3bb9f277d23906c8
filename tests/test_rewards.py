"""Reward scoring (weights, None, faulty functions) and the built-in verifiable rewards."""

from __future__ import annotations

import math

import pytest

from replayrl.rollout.rewards import (
    REWARDS,
    WeightedReward,
    correctness_reward,
    digits_format_reward,
    resolve_rewards,
    score,
)

ROWS = [
    {"prompt": "1+2=", "answer": "3", "a": 1, "b": 2},
    {"prompt": "2+2=", "answer": "4", "a": 2, "b": 2},
    {"prompt": "5+5=", "answer": "10", "a": 5, "b": 5},
]
PROMPTS = [r["prompt"] for r in ROWS]
COMPLETIONS = ["3", "5", "x"]


def constant(value):
    def fn(prompts, completions, **_):
        return [value] * len(completions)

    return fn


def test_builtin_correctness_and_format():
    assert correctness_reward(PROMPTS, [" 3 ", "4", "10x"], answer=["3", "4", "10"]) == [
        1.0,
        1.0,
        0.0,
    ]
    assert digits_format_reward(PROMPTS, ["12", " -3 ", "1 2", "", "x"]) == [1, 1, 0, 0, 0]
    assert set(REWARDS) >= {"correctness", "digits_format"}


def test_weighted_combination_and_means():
    # correctness [1, 0, 0] * 1.0 + digits_format [1, 1, 0] * 0.5 -> [1.5, 0.5, 0.0]
    fns = resolve_rewards([("correctness", 1.0), ("digits_format", 0.5)])
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == pytest.approx([1.5, 0.5, 0.0])
    assert res.per_function == {"correctness": [1.0, 0.0, 0.0], "digits_format": [1.0, 1.0, 0.0]}
    assert res.means() == pytest.approx({"correctness": 1 / 3, "digits_format": 2 / 3})
    assert res.errors == 0
    assert res.first_error is None
    assert res.error_counts == {}


def test_none_means_not_applicable():
    # TRL's nansum: a None value contributes nothing, the rollout is kept
    # rewards = 1.0 * [1, 1, 1] + 2.0 * [None, 2, None] = [1, 5, 1]
    fns = [
        WeightedReward("base", constant(1.0), 1.0),
        WeightedReward("sometimes", lambda prompts, completions, **_: [None, 2.0, None], 2.0),
    ]
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == pytest.approx([1.0, 5.0, 1.0])
    assert res.per_function["sometimes"] == [None, 2.0, None]
    assert res.means()["sometimes"] == pytest.approx(2.0)  # mean of the valid values only
    assert res.errors == 0


def test_all_none_function_mean_is_nan():
    res = score([WeightedReward("never", constant(None))], PROMPTS, COMPLETIONS, ROWS)
    assert math.isnan(res.means()["never"])


def test_rollouts_no_function_scored_have_no_reward_not_zero():
    # every function said "not applicable" for items 0 and 2: a sum of nothing is no reward
    # (skipped and counted), never a reward of 0 that the policy would be trained towards
    fns = [
        WeightedReward("a", lambda prompts, completions, **_: [None, 1.0, None]),
        WeightedReward("b", constant(None), 2.0),
    ]
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [None, 1.0, None]
    assert res.no_reward == 2 and res.first_no_reward == PROMPTS[0]
    assert res.errors == 0 and res.reasons == {} and res.first_error is None
    res = score([WeightedReward("never", constant(None))], PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [None, None, None] and res.no_reward == 3 and res.errors == 0


def test_function_raising_for_one_item_drops_only_that_item():
    def faulty(prompts, completions, **_):
        if "x" in completions:
            raise RuntimeError("cannot parse 'x'")
        return [0.25] * len(completions)

    fns = resolve_rewards([("correctness", 1.0)]) + [WeightedReward("faulty", faulty, 2.0)]
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    # items 0, 1: correctness [1, 0] + 2 * 0.25
    assert res.rewards[:2] == pytest.approx([1.5, 0.5])
    assert res.rewards[2] is None
    assert res.errors == 1
    assert res.error_counts == {"faulty": 1}
    assert "faulty" in res.first_error
    assert "RuntimeError" in res.first_error
    assert "cannot parse" in res.first_error
    assert res.per_function["faulty"] == [0.25, 0.25, None]
    assert res.per_function["correctness"] == [1.0, 0.0, 0.0]  # the other function still ran


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "abc"])
def test_bad_value_for_one_item_drops_it(bad):
    def fn(prompts, completions, **_):
        return [bad if c == "5" else 1.0 for c in completions]

    res = score([WeightedReward("odd", fn)], PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [1.0, None, 1.0]
    assert res.errors == 1
    assert "'odd'" in res.first_error


def test_bool_values_are_numbers():
    fn = lambda prompts, completions, **_: [True, False, True]  # noqa: E731
    res = score([WeightedReward("b", fn, 2.0)], PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [2.0, 0.0, 2.0]


def test_wrong_length_on_batches_is_recovered_item_by_item():
    # drops the last value of a batch, but is right for single items: isolation recovers all
    calls = []

    def fn(prompts, completions, **_):
        calls.append(len(completions))
        out = [1.0] * len(completions)
        return out[:-1] if len(completions) > 1 else out

    res = score([WeightedReward("short", fn)], PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [1.0, 1.0, 1.0]
    assert res.errors == 0
    assert calls == [3, 1, 1, 1]  # one batch call, then one call per item


@pytest.mark.parametrize(
    "fn",
    [
        lambda prompts, completions, **_: [1.0] * (len(completions) + 1),
        lambda prompts, completions, **_: None,
    ],
    ids=["always-wrong-length", "returns-None"],
)
def test_always_wrong_output_drops_every_item(fn):
    fns = resolve_rewards([("correctness", 1.0)]) + [WeightedReward("broken", fn)]
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    assert res.rewards == [None, None, None]
    assert res.errors == 3
    assert res.error_counts == {"broken": 3}
    assert "'broken'" in res.first_error
    assert "3 completions" in res.first_error  # the real lengths


@pytest.mark.parametrize(
    ("out", "reason", "words"),
    [
        (
            None,
            "not_a_list",
            "returned NoneType None, not a list with one value for each of the 3 completions",
        ),
        (1.0, "not_a_list", "returned float 1.0, not a list"),
        ([1.0] * 4, "wrong_length", "returned list of 4 values for 3 completions"),
    ],
)
def test_a_result_that_is_no_list_is_not_called_a_wrong_length(out, reason, words):
    # a bare None (a missing `return`) has no length to be wrong: the label says what it is
    # and how to mean "not applicable"
    res = score([WeightedReward("f", lambda **_: out)], PROMPTS, COMPLETIONS, ROWS)
    assert res.reasons == {reason: 3}
    assert words in res.first_error and f"[{reason}]" in res.first_error
    if reason == "not_a_list":
        assert "[None] * len(completions)" in res.first_error


def test_errors_count_rollouts_not_function_failures():
    boom = lambda prompts, completions, **_: 1 / 0  # noqa: E731
    fns = [WeightedReward("f1", boom), WeightedReward("f2", boom)]
    res = score(fns, PROMPTS, COMPLETIONS, ROWS)
    assert res.errors == 3  # three rollouts dropped ...
    assert res.error_counts == {"f1": 3, "f2": 3}  # ... each failing in both functions
    assert res.first_error.startswith("reward function 'f1'")
    assert "ZeroDivisionError" in res.first_error


def test_columns_are_passed_as_keyword_lists():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return [0.0] * len(completions)

    score([WeightedReward("spy", spy)], PROMPTS, COMPLETIONS, ROWS)
    assert seen == {
        "prompts": PROMPTS,
        "completions": COMPLETIONS,
        "answer": ["3", "4", "10"],
        "a": [1, 2, 5],
        "b": [2, 2, 5],
    }


def test_unknown_reward_name():
    with pytest.raises(ValueError, match="'corectness'") as info:
        resolve_rewards([("corectness", 1.0)])
    assert "did you mean correctness?" in str(info.value)
    assert "path/to/file.py:function" in str(info.value)
