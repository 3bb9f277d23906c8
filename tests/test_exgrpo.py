"""ExGRPO (arXiv 2510.02245; data/exgrpo.py, algorithms/exgrpo_loss.py): the collection and
retirement rule, the Gaussian bucket sampler, lowest-entropy selection, the mixed group, the
mixed-policy loss, the batch source's accounting and checkpoint, and runs through the CLI and
the Python API. Values are hand-computed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.algorithms.exgrpo_loss import exgrpo_loss, policy_shaping
from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.groups import Group
from replayrl.data.rollout_record import Rollout
from replayrl.methods.exgrpo import (
    ExgrpoConfig,
    ExgrpoSource,
    ExperienceStore,
    bucket_counts,
    bucket_weights,
    mixed_group_advantages,
    question_action,
    replay_count,
    sample_questions,
    select_trajectory,
)
from replayrl.run.state import Counters, ledger


def ro(gid: int, correct: bool, prompt: str, version: int = 0, tokens: tuple = (3, 4)) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor(tokens),
        behaviour_logprobs=torch.full((len(tokens),), -0.5),
        reward=float(correct),
        advantage=0.0,
        correct=correct,
        group_id=gid,
        policy_version=version,
        step=0,
        prompt_text=prompt,
    )


def group(gid: int, prompt: str, correct: list[bool], version: int = 0) -> list[Rollout]:
    # distinct completions per member (so the store's de-duplication keeps each)
    return [ro(gid, c, prompt, version, (3, 4 + i)) for i, c in enumerate(correct)]


def _checkpointed(state: dict) -> dict:
    """Through the checkpoint codec (JSON + safetensors; nothing pickled)."""
    from replayrl.storage.safe_state import dumps, loads

    return loads(*dumps(state))


# -- pure functions --------------------------------------------------------------------------


def test_question_action_retires_all_correct_and_skips_all_wrong() -> None:
    assert question_action(8, 8) == "retire"
    assert question_action(0, 8) == "skip"
    assert question_action(1, 8) == question_action(7, 8) == "store"
    with pytest.raises(ValueError):
        question_action(5, 4)


def test_bucket_weights_are_the_gaussian_around_half_of_k() -> None:
    c = 1 / math.sqrt(2 * math.pi)  # 0.398942
    w = bucket_weights([4, 3, 6, 1], 8, 1.0)
    assert w[0] == pytest.approx(c)
    assert w[1] == pytest.approx(c * math.exp(-0.5))  # 0.241971
    assert w[2] == pytest.approx(c * math.exp(-2.0))  # 0.053991
    assert w[3] == pytest.approx(c * math.exp(-4.5))  # 0.004432
    # sigma 2: (k - 4)^2 / 8
    assert bucket_weights([2], 8, 2.0)[0] == pytest.approx(math.exp(-0.5) / math.sqrt(8 * math.pi))


def test_bucket_counts_caps_at_bucket_size_and_moves_the_excess() -> None:
    rng = np.random.default_rng(0)
    # all of the probability on bucket 0 (size 1): 3 drawn there, 1 kept, 2 moved to bucket 1
    assert bucket_counts([1, 5], [1.0, 1e-12], 3, rng) == [1, 2]
    # more asked than stored: everything, once
    assert bucket_counts([2, 1], [1.0, 1.0], 5, rng) == [2, 1]
    assert bucket_counts([], [], 4, rng) == []


def test_bucket_counts_rejects_zero_weight_everywhere() -> None:
    with pytest.raises(ValueError, match="weight 0"):
        bucket_counts([0, 3], [1.0, 0.0], 2, np.random.default_rng(0))


def test_buckets_are_drawn_by_weight_not_by_size() -> None:
    # one question in bucket A, 100 in bucket B, equal weights: A is drawn half the time
    rng = np.random.default_rng(1)
    hits = sum(bucket_counts([1, 100], [1.0, 1.0], 1, rng)[0] for _ in range(4000))
    assert 0.47 < hits / 4000 < 0.53


def test_sample_questions_prefers_medium_difficulty() -> None:
    rates = {"easy": 7 / 8, "medium": 4 / 8, "hard": 1 / 8}
    rng = np.random.default_rng(2)
    draws = [sample_questions(rates, 8, 1, 1.0, rng)[0] for _ in range(3000)]
    # p(medium) = 1 / (1 + 2 exp(-4.5)) = 0.97826
    assert draws.count("medium") / 3000 == pytest.approx(0.97826, abs=0.01)
    assert sorted(sample_questions(rates, 8, 5, 1.0, rng)) == ["easy", "hard", "medium"]


def test_select_trajectory_takes_the_lowest_entropy_first_on_ties() -> None:
    rng = np.random.default_rng(0)
    assert select_trajectory([0.9, 0.2, 0.2, 0.5], "entropy", rng) == 1
    assert select_trajectory([0.3], "random", rng) == 0
    with pytest.raises(ValueError):
        select_trajectory([], "entropy", rng)


def test_replay_count_makes_rho_the_replayed_share() -> None:
    assert replay_count(8, 0.5) == 8  # 8 of 16
    assert replay_count(8, 0.25) == 3  # round(8 / 3): 3 of 11
    assert replay_count(8, 0.0) == 0
    with pytest.raises(ValueError):
        replay_count(8, 1.0)


def test_mixed_group_advantages_normalise_over_fresh_and_replayed() -> None:
    fresh = group(7, "q", [False, False, True], version=3)
    stored = ro(1, True, "q", version=1, tokens=(9, 9))
    out = mixed_group_advantages(fresh, stored, 42, scale_rewards=True)
    # rewards 0 0 1 1: mean 0.5, unbiased std sqrt(1/3) = 0.57735, A = +-0.86603
    assert [r.advantage for r in out] == pytest.approx(
        [-0.86603, -0.86603, 0.86603, 0.86603], abs=1e-4
    )
    assert all(r.group_id == 42 and r.group_mean_reward == 0.5 for r in out)
    assert out[-1].policy_version == 1 and out[-1].behaviour_logprobs is stored.behaviour_logprobs
    assert stored.advantage == 0.0 and stored.group_id == 1  # the stored one is unchanged
    no_std = mixed_group_advantages(fresh, stored, 42, scale_rewards=False)
    assert [r.advantage for r in no_std] == pytest.approx([-0.5, -0.5, 0.5, 0.5])


# -- the loss --------------------------------------------------------------------------------


def test_exgrpo_loss_clips_fresh_tokens_and_shapes_replayed_ones() -> None:
    # token 0 fresh with ratio 1.5; token 1 replayed with ratio 1; A = 1 for both
    old = torch.zeros(2, 1)
    logp = torch.tensor([[math.log(1.5)], [0.0]], requires_grad=True)
    stale = torch.tensor([[0.0], [1.0]])
    loss, m = exgrpo_loss(
        logp, old, torch.ones(2), torch.ones(2, 1), stale=stale, epsilon=0.2, shaping_beta=0.1
    )
    # fresh: -min(1.5, 1.2) = -1.2; replayed: -1 / 1.1 = -0.909091; token mean
    assert float(loss.detach()) == pytest.approx(-(1.2 + 1 / 1.1) / 2)
    loss.backward()
    # clipped fresh token: no gradient; replayed: -A beta w / (w + beta)^2 / 2 = -0.041322
    assert logp.grad[0, 0] == 0.0
    assert float(logp.grad[1, 0]) == pytest.approx(-0.1 / 1.21 / 2)
    assert m["off_policy/shaped_ratio_mean"] == pytest.approx(1 / 1.1)
    assert float(policy_shaping(torch.tensor(0.1), 0.1)) == pytest.approx(0.5)


def test_exgrpo_loss_without_replayed_tokens_is_grpo_clip() -> None:
    from replayrl.algorithms.losses import grpo_clip_loss

    logp = torch.tensor([[-0.2, -0.9], [-1.5, -0.1]])
    old = torch.tensor([[-0.5, -0.5], [-1.0, -0.3]])
    adv, mask = torch.tensor([1.0, -2.0]), torch.ones(2, 2)
    a, _ = exgrpo_loss(logp, old, adv, mask, stale=torch.zeros(2, 2))
    b, _ = grpo_clip_loss(logp, old, adv, mask)
    assert float(a) == pytest.approx(float(b))


# -- the store -------------------------------------------------------------------------------


def test_store_keeps_successes_latest_rate_and_retires_solved_questions() -> None:
    st = ExperienceStore(4)
    rows = {1: {"prompt": "a"}, 2: {"prompt": "b"}, 3: {"prompt": "c"}}
    st.update(
        [
            Group(group(1, "a", [True, False, True, False])),
            Group(group(2, "b", [False] * 4)),
            Group(group(3, "c", [True, False, False, False])),
        ],
        rows,
    )
    assert st.eligible() == {"a": 0.5, "c": 0.25} and len(st.trajectories["a"]) == 2
    # c solved by every rollout: retired, removed, never stored again
    st.update([Group(group(4, "c", [True] * 4))], {4: {"prompt": "c"}})
    st.update([Group(group(5, "c", [True, False, False, False]))], {5: {"prompt": "c"}})
    assert "c" not in st.eligible() and st.retired == {"c"}
    # a: new rate 0.25, the same completion again is not stored twice
    st.update([Group(group(6, "a", [True, False, False, False]))], {6: {"prompt": "a"}})
    assert st.rates["a"] == 0.25 and len(st.trajectories["a"]) == 2
    # an all-wrong group leaves the stored rate as it was
    st.update([Group(group(7, "a", [False] * 4))], {7: {"prompt": "a"}})
    assert st.rates["a"] == 0.25
    back = ExperienceStore(4)
    back.load_state_dict(_checkpointed(st.state_dict()))
    assert back.eligible() == st.eligible() and back.retired == st.retired
    assert [r.completion_ids.tolist() for r in back.trajectories["a"]] == [[3, 4], [3, 6]]


def test_store_caps_drop_the_oldest_trajectories_and_questions() -> None:
    st = ExperienceStore(4, per_question=2, max_questions=2)
    # a: successes (3, 4), (3, 6), (3, 7): the oldest, (3, 4), is dropped
    st.update([Group(group(1, "a", [True, False, True, True]))], {1: {"prompt": "a"}})
    assert [r.completion_ids.tolist() for r in st.trajectories["a"]] == [[3, 6], [3, 7]]
    st.update([Group(group(2, "b", [True, False, False, False]))], {2: {"prompt": "b"}})
    # a stored again (a new success (3, 5)): b is now the least recently stored question
    a_again = [ro(3, True, "a", 0, (3, 5)), ro(3, False, "a", 0, (3, 9))]
    a_again += [ro(3, False, "a", 0, (3, 8)), ro(3, False, "a", 0, (3, 10))]
    st.update([Group(a_again)], {3: {"prompt": "a"}})
    assert [r.completion_ids.tolist() for r in st.trajectories["a"]] == [[3, 7], [3, 5]]
    back = ExperienceStore(4, per_question=2, max_questions=2)
    back.load_state_dict(_checkpointed(st.state_dict()))  # the eviction order comes back
    for store in (st, back):
        store.update([Group(group(4, "c", [True, False, False, False]))], {4: {"prompt": "c"}})
        assert list(store.trajectories) == ["a", "c"] and set(store.rows) == {"a", "c"}
        assert set(store.rates) == {"a", "c"} and store.eligible() == {"a": 0.25, "c": 0.25}
        # (3, 4) and (3, 6) from a, then b's one trajectory with b itself
        stats = store.stats()
        assert (stats["evicted_trajectories"], stats["evicted_questions"]) == (3.0, 1.0)
    with pytest.raises(ValueError, match="must be >= 1"):
        ExperienceStore(4, per_question=0)


def test_store_refuses_a_row_it_cannot_save() -> None:
    with pytest.raises(ValueError, match="JSON"):
        ExperienceStore(2).update([Group(group(1, "a", [True, False]))], {1: {"x": object()}})


# -- the batch source ------------------------------------------------------------------------


@dataclass
class FakeProduction:
    rollouts: list[Rollout]
    generated: int
    tokens: int
    dropped_reward_error: int = 0
    dropped_reward_timeout: int = 0
    skipped_too_long: int = 0
    first_error: str | None = None
    seconds: float = 0.0
    reward_seconds: float = 0.0
    stats: dict = field(default_factory=dict)


class FakeProducer:
    """Generates for given rows: question `prompt`'s completions are right by `truth`."""

    def __init__(self, truth: dict[str, list[bool]]) -> None:
        self.truth, self.calls, self.last_rows = truth, [], {}
        self.version = 5

    def produce(self, version, step, base, rows=None, num_generations=None) -> FakeProduction:
        self.calls.append(([r["prompt"] for r in rows], num_generations))
        self.last_rows = {base + i: row for i, row in enumerate(rows)}
        out = []
        for i, row in enumerate(rows):
            out += group(
                base + i, row["prompt"], self.truth[row["prompt"]][:num_generations], self.version
            )
        return FakeProduction(out, len(out), 2 * len(out))

    def sample(self, n: int) -> list[dict]:
        return [{"prompt": f"new{i}"} for i in range(n)]


def _source(producer: FakeProducer, ratio: float = 0.5, epochs: int = 1) -> ExgrpoSource:
    return ExgrpoSource(
        OnPolicyQueue(),
        ExperienceStore(4),
        producer.produce,
        lambda: producer.last_rows,
        producer.sample,
        lambda rs: [float(r.completion_ids[-1]) for r in rs],  # entropy = last token id
        epochs,
        ExgrpoConfig(ratio=ratio, start_accuracy=0.0),
        True,
        0,
    )


def _first_call(producer: FakeProducer, src: ExgrpoSource, c: Counters, prompts: list[str]):
    base = c.step * 1_000_000
    p = producer.produce(producer.version, c.step, base, [{"prompt": q} for q in prompts], 4)
    producer.calls.pop()
    c.account(p)
    return p.rollouts


def test_source_mixes_replayed_questions_and_counts_every_rollout() -> None:
    # every question: successes (3, 4) and (3, 6) (entropy 4 and 6 below)
    truth = {q: [True, False, True, False] for q in ("a", "b", "new0", "new1")}
    producer = FakeProducer(truth)
    src = _source(producer, ratio=0.5, epochs=2)
    c = Counters(step=1)
    src.before_step(None, c, lambda _: None)
    # step 1: store empty: the 2 replay slots are filled with 2 fresh questions
    batch, epochs = src.next_batch(_first_call(producer, src, c, ["a", "b"]), version=5)
    assert producer.calls == [(["new0", "new1"], 4)] and len(batch) == 16 and epochs == 2
    assert c.count("rollouts_reused") == 0 and set(src.store.eligible()) == {
        "a",
        "b",
        "new0",
        "new1",
    }
    # step 2: 2 replayed questions, 3 fresh completions each + the stored trajectory
    c.step, producer.version = 2, 6
    src.before_step(None, c, lambda _: None)
    batch, _ = src.next_batch(_first_call(producer, src, c, ["a", "b"]), version=6)
    ((replayed_qs, k),) = producer.calls[1:]
    assert k == 3 and len(replayed_qs) == 2
    old = [r for r in batch if r.policy_version < 6]
    assert len(old) == 2 and len(batch) == 8 + 2 * 4
    # the lowest "entropy" (last token id) among a question's stored successes: (3, 4)
    assert all(r.completion_ids.tolist() == [3, 4] for r in old)
    # each mixed group (3 fresh + the replayed one) is one group with an id of its own
    mixed_ids = [{r.group_id for r in batch if r.prompt_text == q} for q in replayed_qs]
    fresh_ids = {r.group_id for r in batch if r.prompt_text not in replayed_qs}
    assert all(len(ids) == 1 and isinstance(min(ids), int) for ids in mixed_ids)
    assert len(set.union(*mixed_ids, fresh_ids)) == len(fresh_ids) + 2
    assert c.count("rollouts_reused") == 2 * 2  # two replayed trajectories, two passes
    # a replayed question's latest rate is its fresh completions' (2 of 3), not counting the
    # stored trajectory (which would read 3 of 4)
    assert [src.store.rates[q] for q in replayed_qs] == pytest.approx([2 / 3, 2 / 3])
    assert c.rollouts_generated == 16 + 8 + 6 and c.count("generation_rounds") == 2
    led = ledger(c, src.buffers())
    assert led["balanced"] and led["consumed"] == led["generated"] == 30


def test_source_waits_for_the_start_accuracy() -> None:
    producer = FakeProducer({"a": [False] * 4, "new0": [True, False, False, False]})
    src = _source(producer, ratio=0.5)
    src.ex = ExgrpoConfig(ratio=0.5, start_accuracy=0.3)
    c = Counters(step=1)
    src.before_step(None, c, lambda _: None)
    src.next_batch(_first_call(producer, src, c, ["a"]), version=5)
    assert not src.mixing and len(src.store) == 0  # accuracy 0 < 0.3: nothing collected


def test_source_refuses_a_non_json_row_when_it_first_sees_it() -> None:
    # before mixing starts nothing is stored: the row would fail only at the first mixing
    # step (maybe hours in); the source checks every row of every step instead
    producer = FakeProducer({"a": [False] * 4, "new0": [False] * 4})
    src = _source(producer, ratio=0.5)
    src.ex = ExgrpoConfig(ratio=0.5, start_accuracy=1.0)
    c = Counters(step=1)
    src.before_step(None, c, lambda _: None)
    p = producer.produce(5, 1, 1_000_000, [{"prompt": "a", "when": object()}], 4)
    with pytest.raises(ValueError, match="stores task rows as JSON"):
        src.next_batch(p.rollouts, version=5)
    assert not src.mixing


def test_source_state_round_trip_draws_the_same_questions() -> None:
    truth = {q: [True, False, True, False] for q in "abcdef"}
    truth.update({f"new{i}": [True, False, False, False] for i in range(4)})
    producer = FakeProducer(truth)
    src = _source(producer)
    c = Counters(step=1)
    src.before_step(None, c, lambda _: None)
    src.next_batch(_first_call(producer, src, c, list("abcd")), version=5)
    sample_questions(src.store.eligible(), 4, 2, 1.0, src.rng)  # the generator moves on
    state = _checkpointed(src.state_dict())
    again = _source(FakeProducer(truth))
    again.load_state_dict(state)
    assert again.mixing and again.store.eligible() == src.store.eligible()
    q1 = sample_questions(src.store.eligible(), 4, 3, 1.0, src.rng)
    q2 = sample_questions(again.store.eligible(), 4, 3, 1.0, again.rng)
    assert q1 == q2


# -- config and wiring -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["train.batch_size=64"], "sizes its own batch"),
        (["method.exgrpo.ratio=1.0"], "ratio"),
        (["buffer.capacity=64"], "smaller than the fresh rollouts"),
    ],
)
def test_exgrpo_refuses_settings_it_cannot_honour(extra: list[str], match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        load_config("exgrpo", extra)


def test_exgrpo_capacity_must_hold_the_fresh_and_the_replayed_questions_rollouts() -> None:
    # the preset: 64 fresh rollouts + round(8 * 0.5 / 0.5) = 8 replayed questions x 8
    with pytest.raises(ValueError, match=r"up to 128\)"):
        load_config("exgrpo", ["buffer.capacity=127"])
    assert load_config("exgrpo", ["buffer.capacity=128"]).buffer.capacity == 128


def test_config_keys_reach_the_exgrpo_source() -> None:
    from replayrl.run.components import build_batch_source

    over = ["method.exgrpo.ratio=0.25", "method.exgrpo.selection=random", "method.exgrpo.sigma=2"]
    over += ["method.exgrpo.start_accuracy=0.5", "method.exgrpo.shaping_beta=0.3"]
    over += ["method.exgrpo.store_per_question=3", "method.exgrpo.store_questions=5"]
    cfg = load_config("exgrpo", over)
    src = build_batch_source(cfg, OnPolicyQueue())
    assert (src.store.per_question, src.store.max_questions) == (3, 5)
    assert isinstance(src, ExgrpoSource) and src.produce is None and src.entropies is None
    assert (src.ex.ratio, src.ex.selection, src.ex.sigma) == (0.25, "random", 2.0)
    assert (src.ex.start_accuracy, src.ex.shaping_beta) == (0.5, 0.3)
    assert src.store.group_size == 8 and cfg.algorithm.loss_type == "exgrpo"


def _mixed_correctness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model is never right on arithmetic: call an even-length completion right."""
    from replayrl.rollout.tasks.arithmetic import ArithmeticTask

    monkeypatch.setattr(ArithmeticTask, "is_correct", lambda self, c, row: len(c) % 2 == 0)


def test_exgrpo_trains_through_the_cli_and_replays(tmp_path: Path, monkeypatch) -> None:
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    _mixed_correctness(monkeypatch)
    argv = [*TINY_RUN, "train.threads=1", "train.steps=3", f"logging.run_dir={tmp_path}"]
    argv += ["logging.name=ex", "method.exgrpo.start_accuracy=0"]
    assert main(["train", "--config", "exgrpo", *argv]) == 0
    s = json.loads((tmp_path / "ex" / "summary.json").read_text())
    led = s["accounting"]["ledger"]
    assert s["steps"] == 3 and led["balanced"] and led["generated"] == led["consumed"]
    assert s["rollouts_generated"] == led["generated"] and s["rollouts_reused"] > 0
    # every batch: 2 fresh + 2 replayed-or-filled questions x K = 4 (a replayed one: 3 fresh
    # completions and its stored trajectory), so generated = trained - reused
    assert s["evals"][-1]["rollouts_trained"] == 3 * 4 * 4
    assert s["rollouts_generated"] == 3 * 4 * 4 - s["rollouts_reused"]
    # the learner marks the replayed trajectories: the loss shaped their ratio
    from replayrl.run.metrics import read_metrics

    rows = read_metrics(tmp_path / "ex" / "metrics.jsonl")
    assert max(r.get("train/off_policy/shaped_ratio_mean", 0.0) for r in rows) > 0.5


def test_exgrpo_crash_and_resume_equals_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The experience survives a checkpoint: a run (Python API) that crashes after step 3 and
    resumes from step 2 logs, step by step, what the whole run logged (a store, bucket
    sampler or mixing flag not restored changes the replayed questions and so the metrics)."""
    from tiny import TINY_RUN, crash_and_resume

    _mixed_correctness(monkeypatch)
    common = [*TINY_RUN, "train.threads=1", "method.exgrpo.start_accuracy=0"]
    common += ["checkpoint.every=1"]
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, "exgrpo", common
    )
    assert len(whole_steps) == 4
    assert crash_steps == whole_steps
    for key in ("rollouts_generated", "rollouts_reused", "generation_rounds_extra"):
        assert resumed[key] == whole[key]
    assert resumed["accounting"]["ledger"] == whole["accounting"]["ledger"]
    assert whole["accounting"]["ledger"]["balanced"]
    # replay happened after the resume point, so the restored store is what was tested
    reused = [r.get("train/off_policy/shaped_ratio_mean", 0.0) for r in whole_steps]
    assert reused[2] > 0 and reused[3] > 0


@pytest.mark.parametrize(
    "extra",
    [
        [],  # the grpo preset: no group source
        ["method.name=replay", "buffer.capacity=64"],  # a replay buffer's stale rollouts
        ["method.name=ar3po"],  # AR3PO's reused copies
    ],
)
def test_exgrpo_loss_without_its_source_is_refused(extra: list[str]) -> None:
    # the shaped, unclipped term would change every other stale rollout's objective silently
    with pytest.raises(ConfigError, match="loss_type=exgrpo needs method.name=exgrpo"):
        load_config("grpo", [*extra, "algorithm.loss_type=exgrpo"])


def test_exgrpo_source_with_another_loss_warns(recwarn: pytest.WarningsRecorder) -> None:
    with pytest.warns(UserWarning, match="is built for algorithm.loss_type=exgrpo"):
        cfg = load_config("exgrpo", ["algorithm.loss_type=grpo_clip"])
    assert cfg.method.name == "exgrpo"  # an ablation: allowed
    recwarn.clear()
    load_config("exgrpo")  # the preset pairs them: no warning
    assert not [w for w in recwarn if "is built for" in str(w.message)]
