"""task.name=reasoning_gym: seeded split, messages, the package's scorer as the reward."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from replayrl.config.schema import ConfigError, load_config
from replayrl.rollout.rewards import resolve_rewards, score
from replayrl.rollout.rewards.reasoning_gym import extract_tagged_answer
from replayrl.rollout.tasks import task_from_config

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="reasoning-gym not installed"
)

RG = [
    "task.name=reasoning_gym",
    "task.reasoning_gym.datasets=[basic_arithmetic, chain_sum]",
    "task.reasoning_gym.size=500",
    "task.eval_size=20",
    "task.reasoning_gym.config={chain_sum: {min_terms: 2, max_terms: 3}}",
]


def _task(*extra: str):
    return task_from_config(load_config(None, [*RG, *extra]).task)


def test_rows_split_and_determinism():
    task = _task()
    ev = task.eval_rows()
    assert len(ev) == 20
    assert {r["rg_dataset"] for r in ev} == {"basic_arithmetic", "chain_sum"}
    r = ev[0]
    assert [m["role"] for m in r["prompt"]] == ["system", "user"]
    assert "<answer>" in r["prompt"][0]["content"]  # reasoning-gym's answer format
    assert r["prompt"][1]["content"] == r["rg_entry"]["question"]
    # seeded: same config, same rows; another seed, other rows
    assert [x["answer"] for x in _task().eval_rows()] == [x["answer"] for x in ev]
    other = _task("task.seed=5").eval_rows()
    assert [x["rg_entry"]["question"] for x in other] != [x["rg_entry"]["question"] for x in ev]
    train = task.sample_train(200, np.random.default_rng(0))
    held_out = {x["rg_entry"]["question"] for x in ev}
    assert not any(x["rg_entry"]["question"] in held_out for x in train)
    # per-dataset config applies: chain_sum with 2-3 terms
    for x in train:
        if x["rg_dataset"] == "chain_sum":
            assert 2 <= x["rg_entry"]["metadata"]["num_terms"] <= 3


def test_scorer_is_the_reward_and_errors_are_counted():
    task = _task()
    rows = task.eval_rows()[:4]
    completions = [
        f"Let me think. <answer>{rows[0]['answer']}</answer>",  # right
        "<answer>123456789</answer>",  # wrong
        f"the answer is {rows[2]['answer']}",  # right number but no tag: 0
        f"<answer>0</answer> then <answer>{rows[3]['answer']}</answer>",  # the last tag counts
    ]
    res = score(resolve_rewards([("reasoning_gym", 1.0)]), ["p"] * 4, completions, rows)
    assert res.rewards == [1.0, 0.0, 0.0, 1.0]
    assert [task.is_correct(c, r) for c, r in zip(completions, rows, strict=True)] == [
        True,
        False,
        False,
        True,
    ]
    # a row whose entry is broken: that rollout is dropped and counted, the others scored
    bad = dict(rows[1], rg_entry={"question": "?"})  # no answer to compare with
    res = score(
        resolve_rewards([("reasoning_gym", 1.0)]),
        ["p"] * 2,
        [completions[0], "<answer>1</answer>"],
        [rows[0], bad],
    )
    assert res.rewards[0] == 1.0 and res.rewards[1] is None and res.errors == 1


def test_extract_tagged_answer():
    assert extract_tagged_answer("a <answer> 7 </answer>") == "7"
    assert extract_tagged_answer("<answer>1</answer><answer>\n2\n</answer>") == "2"
    assert extract_tagged_answer("no tag") is None


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="datasets must name"):
        load_config(None, ["task.name=reasoning_gym"])
    with pytest.raises(ValueError, match="unknown"):
        _task("task.reasoning_gym.datasets=[no_such_dataset]", "task.reasoning_gym.config={}")
    with pytest.raises(ValueError, match="not in use"):
        _task("task.reasoning_gym.config={gcd: {}}")


def test_reward_runs_under_the_reward_timeout(monkeypatch):
    """The reasoning_gym reward is called through scoring.score like every reward: a scorer
    that hangs past rollout.reward_timeout_s drops that call's rollouts as "timeout"."""
    import threading

    from replayrl.rollout.rewards import reasoning_gym as rg_reward

    task = _task()
    rows = task.eval_rows()[:2]
    release = threading.Event()

    def hang(*args, **kwargs):
        release.wait(5)  # abandoned by score(); released below so the thread ends
        return 1.0

    monkeypatch.setattr(rg_reward, "score_completion", hang)
    try:
        res = score(
            resolve_rewards([("reasoning_gym", 1.0)]),
            ["p"] * 2,
            ["<answer>1</answer>"] * 2,
            rows,
            timeout_s=0.2,
        )
    finally:
        release.set()
    assert res.rewards == [None, None]
    assert res.timeouts >= 1 and res.reasons.get("timeout") == 2
