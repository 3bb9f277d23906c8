"""RePO (arXiv 2506.09340; methods/repo.py): the replay strategies, the separate
off-policy advantages, the per-prompt buffers, the prompt pool, the batch source's
composition, accounting and checkpoint, and runs through the CLI and the Python API.
Values are hand-computed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.rollout_record import Rollout
from replayrl.methods.repo import (
    PromptPool,
    PromptReplayStore,
    RepoConfig,
    RepoSource,
    max_variance_subset,
    off_policy_advantages,
    retrieve,
)
from replayrl.run.state import Counters

# a prompt's buffer, oldest first
REWARDS = [0.0, 1.0, 0.5, 1.0, 0.0, 0.2]


def ro(prompt: str, reward: float, gid: int = 0, version: int = 0, tok: int = 3) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([tok, 4]),
        behaviour_logprobs=torch.full((2,), -0.5 - version),
        reward=reward,
        advantage=0.0,
        correct=reward > 0.5,
        group_id=gid,
        policy_version=version,
        step=version,
        prompt_text=prompt,
    )


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# -- the replay strategies -----------------------------------------------------------------------


def test_all_returns_the_whole_buffer_whatever_k() -> None:
    assert retrieve(REWARDS, "all", 2, rng()) == [0, 1, 2, 3, 4, 5]


def test_recency_returns_the_newest_k() -> None:
    assert retrieve(REWARDS, "recency", 2, rng()) == [4, 5]
    assert retrieve(REWARDS, "recency", 9, rng()) == [0, 1, 2, 3, 4, 5]  # k capped


def test_reward_returns_the_highest_k_older_first_on_ties() -> None:
    # 1.0 (1), 1.0 (3), 0.5 (2)
    assert retrieve(REWARDS, "reward", 3, rng()) == [1, 2, 3]
    # two of three 1.0s: the older two, as the code's stable sort
    assert retrieve([1.0, 0.0, 1.0, 1.0], "reward", 2, rng()) == [0, 2]


def test_variance_takes_the_extremes_and_the_larger_sum_on_ties() -> None:
    # pairs: {0.0, 1.0} has variance 0.25, the largest; first 0.0 (0) and last 1.0 (3)
    assert retrieve(REWARDS, "variance", 2, rng()) == [0, 3]
    # triples: {0, 1, 1} and {0, 0, 1} both have variance 2/9; {0, 1, 1} has the larger sum
    assert retrieve(REWARDS, "variance", 3, rng()) == [0, 1, 3]
    vals = [REWARDS[i] for i in max_variance_subset(REWARDS, 3)]
    assert np.var(vals) == pytest.approx(2 / 9) and sum(vals) == 2.0


def test_variance_matches_the_codes_exhaustive_search() -> None:
    """The code enumerates every k-subset (ties to the larger sum); ours compares k + 1."""
    g = np.random.default_rng(7)
    for _ in range(200):
        n = int(g.integers(1, 9))
        rewards = [float(x) for x in g.choice([0.0, 0.25, 0.5, 1.0, 2.0], size=n)]
        k = int(g.integers(1, n + 1))
        best = max(
            (float(np.var([rewards[i] for i in s])), float(sum(rewards[i] for i in s)))
            for s in itertools.combinations(range(n), k)
        )
        got = [rewards[i] for i in max_variance_subset(rewards, k)]
        assert (float(np.var(got)), float(sum(got))) == pytest.approx(best)


def test_random_draws_k_distinct_reproducibly_and_reaches_every_response() -> None:
    a = retrieve(REWARDS, "random", 3, np.random.default_rng(1))
    assert a == retrieve(REWARDS, "random", 3, np.random.default_rng(1))
    assert len(set(a)) == 3 and a == sorted(a)
    g = np.random.default_rng(2)
    seen = {i for _ in range(50) for i in retrieve(REWARDS, "random", 2, g)}
    assert seen == set(range(6))


def test_retrieve_rejects_what_it_cannot_do() -> None:
    assert retrieve([], "reward", 2, rng()) == []
    with pytest.raises(ValueError, match="replay strategy 'best'"):
        retrieve(REWARDS, "best", 2, rng())
    with pytest.raises(ValueError, match="k=0"):
        retrieve(REWARDS, "reward", 0, rng())


def test_max_variance_subset_names_the_k_it_cannot_take() -> None:
    # retrieve caps k at the buffer's size; a direct call out of range says which k and range
    for k in (0, 4):
        with pytest.raises(ValueError, match=rf"k={k}: must be in 1\.\.3"):
            max_variance_subset([0.0, 1.0, 0.5], k)


# -- the off-policy advantages -------------------------------------------------------------------


def test_off_policy_advantages_normalise_over_the_retrieved_only() -> None:
    old = [ro("q", r, gid=7, version=2) for r in (1.0, 0.0, 0.0, 1.0)]
    out = off_policy_advantages(old, 99, scale_rewards=True)
    # mean 0.5, unbiased std sqrt(1/3): +-0.5 / 0.57735 = +-0.8660
    assert [r.advantage for r in out] == pytest.approx([0.8660, -0.8660, -0.8660, 0.8660], abs=1e-3)
    assert all(r.group_id == 99 and r.group_mean_reward == 0.5 for r in out)
    # the behaviour policy and its log-probs stay: the learner sees them as stale
    assert all(
        r.policy_version == 2 and torch.equal(r.behaviour_logprobs, o.behaviour_logprobs)
        for r, o in zip(out, old, strict=True)
    )
    assert all(o.advantage == 0.0 and o.group_id == 7 for o in old)  # the stored ones unchanged
    unscaled = off_policy_advantages(old[:3], 1, scale_rewards=False)
    assert [r.advantage for r in unscaled] == pytest.approx([2 / 3, -1 / 3, -1 / 3])


# -- the store and the pool ----------------------------------------------------------------------


def test_store_keeps_the_newest_per_prompt_and_the_most_recent_prompts() -> None:
    s = PromptReplayStore(buffer_size=3, max_prompts=2)
    s.add([ro("a", float(i), tok=i) for i in range(5)])
    assert [r.reward for r in s.get("a")] == [2.0, 3.0, 4.0]  # the oldest two dropped
    s.add([ro("b", 1.0)])
    s.add([ro("c", 1.0)])
    assert list(s.responses) == ["b", "c"] and s.get("a") == [] and s.evicted_prompts == 1
    s.add([ro("b", 0.5)])
    s.add([ro("d", 0.5)])
    assert list(s.responses) == ["b", "d"]  # b was stored more recently than c


class FakeTask:
    def sample_train(self, n: int, g: np.random.Generator) -> list[dict]:
        return [{"prompt": f"p{int(g.integers(1000))}-{i}"} for i in range(n)]

    def is_correct(self, completion: str, row: dict) -> bool:
        return completion == "ok"


def test_pool_visits_every_prompt_once_per_pass_and_resumes() -> None:
    pool = PromptPool(FakeTask(), 3, seed=0)
    assert len(pool.rows) == 3 and pool.is_correct("ok", {})  # the task's other methods
    first = [r["prompt"] for r in pool.sample_train(3, rng())]
    assert sorted(first) == sorted(r["prompt"] for r in pool.rows) and pool.passes == 1
    state = json.loads(json.dumps(pool.state_dict()))
    nxt = [r["prompt"] for r in pool.sample_train(4, rng())]
    assert sorted(nxt[:3]) == sorted(first) and pool.passes == 3
    again = PromptPool(FakeTask(), 3, seed=0)
    again.load_state_dict(state)
    assert [r["prompt"] for r in again.sample_train(4, rng())] == nxt


# -- the batch source ----------------------------------------------------------------------------


def _source(**kw) -> RepoSource:
    rp = RepoConfig(**{"strategy": "recency", "num_replays": 2, "buffer_size": 4, **kw})
    return RepoSource(OnPolicyQueue(), PromptReplayStore(rp.buffer_size, 100), rp, 1, True, 0)


def _fresh(step: int, prompts: dict[str, list[float]]) -> list[Rollout]:
    out = []
    for j, (p, rewards) in enumerate(prompts.items()):
        out += [
            ro(p, r, gid=step * 1_000_000 + j, version=step, tok=10 * step + i)
            for i, r in enumerate(rewards)
        ]
    return out


def test_source_replays_for_the_steps_prompts_once_their_buffers_fill() -> None:
    src, c = _source(min_buffer=4), Counters()
    src.before_step(None, c, lambda _: None)
    step0 = _fresh(0, {"a": [1, 0, 0, 1], "b": [0, 0, 0, 1]})
    b1, _ = src.next_batch(step0, 0)
    assert len(b1) == 8 and c.count("rollouts_reused") == 0  # nothing stored before this step
    c.step = 1
    fresh = _fresh(1, {"a": [1, 1, 1, 1], "c": [0, 1, 0, 1]})
    b2, epochs = src.next_batch(fresh, 1)
    assert epochs == 1 and {id(r) for r in b2[:8]} == {id(r) for r in fresh}  # fresh first
    old = b2[8:]
    # only a has a full buffer: its 2 newest step-0 responses (rewards 0, 1), A_off = -+0.7071
    assert [(r.prompt_text, r.policy_version, r.reward) for r in old] == [
        ("a", 0, 0.0),
        ("a", 0, 1.0),
    ]
    assert [r.advantage for r in old] == pytest.approx([-0.7071, 0.7071], abs=1e-3)
    assert c.count("rollouts_reused") == 2
    # the fresh groups keep their own (on-policy) advantages; a step never replays its own
    assert all(r.policy_version == 1 for r in b2[:8])
    assert [r.policy_version for r in src.store.get("a")] == [1, 1, 1, 1]  # step 1's now
    # a's two replayed responses were in two batches (step 0's, step 1's), the rest in one
    assert [r.times_sampled for r in step0] == [1, 1, 2, 2, 1, 1, 1, 1]


def test_source_waits_for_min_buffer() -> None:
    src, c = _source(min_buffer=4, buffer_size=8), Counters()
    src.before_step(None, c, lambda _: None)
    src.next_batch(_fresh(0, {"a": [1, 0, 1]}), 0)  # 3 stored < 4
    c.step = 1
    b, _ = src.next_batch(_fresh(1, {"a": [1, 0, 1]}), 1)
    assert len(b) == 3 and c.count("rollouts_reused") == 0
    c.step = 2
    b, _ = src.next_batch(_fresh(2, {"a": [0, 0, 1]}), 2)
    assert len(b) == 5 and c.count("rollouts_reused") == 2  # 6 stored: the 2 newest, step 1's


def test_source_state_round_trip_replays_the_same() -> None:
    from replayrl.storage.safe_state import dumps, loads

    src, c = _source(strategy="random", min_buffer=2), Counters()
    src.before_step(None, c, lambda _: None)
    src.next_batch(_fresh(0, {"a": [1, 0, 0, 1]}), 0)
    state = loads(*dumps(src.state_dict()))  # JSON + safetensors, nothing pickled
    twin, c2 = _source(strategy="random", min_buffer=2), Counters()
    twin.load_state_dict(state)
    twin.before_step(None, c2, lambda _: None)
    c.step = c2.step = 1
    a, _ = src.next_batch(_fresh(1, {"a": [1, 1, 0, 0]}), 1)
    b, _ = twin.next_batch(_fresh(1, {"a": [1, 1, 0, 0]}), 1)
    assert [(r.reward, r.completion_ids.tolist()) for r in a[4:]] == [
        (r.reward, r.completion_ids.tolist()) for r in b[4:]
    ]


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["train.batch_size=16"], "sizes its own batch"),
        (["method.repo.min_buffer=32"], "no prompt's buffer could ever replay"),
        (["buffer.capacity=32"], "smaller than a step's fresh rollouts"),
        (["runtime=async-local"], "needs runtime=sync"),
        (["method.repo.strategy=best"], "strategy"),
    ],
)
def test_repo_refuses_settings_it_cannot_honour(extra: list[str], match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        load_config("repo", extra)


def test_config_keys_reach_the_repo_source() -> None:
    from replayrl.run.components import build_batch_source

    over = ["method.repo.strategy=variance", "method.repo.num_replays=3"]
    over += ["method.repo.buffer_size=5", "method.repo.min_buffer=4", "method.repo.max_prompts=7"]
    over += ["method.repo.prompt_pool=12"]
    cfg = load_config("repo", over)
    src = build_batch_source(cfg, OnPolicyQueue())
    assert isinstance(src, RepoSource) and src.pool is None  # no producer: no pool
    assert (src.rp.strategy, src.rp.num_replays, src.rp.min_buffer) == ("variance", 3, 4)
    assert (src.store.buffer_size, src.store.max_prompts, src.rp.prompt_pool) == (5, 7, 12)


# -- end to end ----------------------------------------------------------------------------------

SMALL = ["method.repo.prompt_pool=2", "method.repo.buffer_size=8", "method.repo.min_buffer=4"]
SMALL += ["method.repo.num_replays=3", "method.repo.strategy=reward"]


def _mixed_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model is never right on arithmetic: call an even-length completion right."""
    from replayrl.rollout.tasks.arithmetic import ArithmeticTask

    monkeypatch.setattr(ArithmeticTask, "is_correct", lambda self, c, row: len(c) % 2 == 0)


def test_repo_trains_through_the_cli_and_replays(tmp_path: Path, monkeypatch) -> None:
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    _mixed_rewards(monkeypatch)
    argv = [*TINY_RUN, "train.threads=1", "train.steps=3", f"logging.run_dir={tmp_path}"]
    assert main(["train", "--config", "repo", *argv, *SMALL, "logging.name=rp"]) == 0
    s = json.loads((tmp_path / "rp" / "summary.json").read_text())
    led = s["accounting"]["ledger"]
    assert s["steps"] == 3 and led["balanced"] and led["generated"] == led["consumed"]
    # 2 pool prompts x 4 per step: step 1 stores 4 each, step 2 replays 3 of each prompt's
    # 4, step 3 3 of its 8 -> 12 reused, never generated
    assert s["rollouts_generated"] == 3 * 8 and s["rollouts_reused"] == 12
    assert s["evals"][-1]["rollouts_trained"] == 3 * 8 + 12


def test_repo_crash_and_resume_equals_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffers, the strategy's generator and the pool's order survive a checkpoint: a
    run that crashes after step 3 and resumes from step 2 logs what the whole run logged."""
    from tiny import TINY_RUN, crash_and_resume

    _mixed_rewards(monkeypatch)
    common = [*TINY_RUN, "train.threads=1", "checkpoint.every=1", *SMALL]
    common += ["method.repo.strategy=random", "method.repo.prompt_pool=3"]
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, "repo", common
    )
    assert len(whole_steps) == 4 and crash_steps == whole_steps
    assert resumed["rollouts_reused"] == whole["rollouts_reused"] > 0
    assert resumed["accounting"]["ledger"] == whole["accounting"]["ledger"]
