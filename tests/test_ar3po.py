"""AR3PO (arXiv 2509.25808): the allocation and reuse rules by hand, the store, the batch
source's rounds and accounting, and runs through the CLI, the Python API and a resume."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.rollout_record import Rollout
from replayrl.methods.ar3po import (
    Ar3poConfig,
    Ar3poSource,
    CorrectResponseStore,
    regroup,
    responses_to_reuse,
    round_allocation,
)
from replayrl.run.state import Counters, ledger


def ro(gid: int, reward: float, prompt: str, version: int = 0, lp: float = -1.0) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([3, 4]),
        behaviour_logprobs=torch.full((2,), lp),
        reward=reward,
        advantage=0.0,
        correct=reward > 0.5,
        group_id=gid,
        policy_version=version,
        step=0,
        prompt_text=prompt,
    )


# -- the pure rules -----------------------------------------------------------------------------


def test_round_allocation_stops_a_prompt_at_its_first_correct_response_or_the_cap() -> None:
    # prompts: solved (1 correct), unsolved with room (4 of 8 used), unsolved at the cap
    # (8 of 8), unsolved with room for less than a round (6 of 8, k = 4)
    assert round_allocation([1, 0, 0, 0], [4, 4, 8, 6], 4, 1, 8) == [0, 4, 0, 0]
    # stop_correct = 2: one correct response is not enough yet
    assert round_allocation([1, 2], [4, 4], 4, 2, 12) == [4, 0]
    with pytest.raises(ValueError, match="2 correct counts but 1"):
        round_allocation([0, 0], [4], 4, 1, 8)
    with pytest.raises(ValueError, match="must be >= 1"):
        round_allocation([0], [4], 0, 1, 8)


def test_responses_to_reuse_only_for_a_group_without_a_correct_response() -> None:
    stored = [ro(1, 1.0, "q", version=v) for v in (3, 5, 7)]  # newest last
    assert responses_to_reuse(0, stored, 1) == [stored[2]]
    assert responses_to_reuse(0, stored, 2) == stored[1:]
    assert responses_to_reuse(1, stored, 1) == []  # it has a correct response of its own
    assert responses_to_reuse(0, stored, 0) == []  # reuse off
    assert responses_to_reuse(0, [], 1) == []  # nothing stored for this prompt yet
    with pytest.raises(ValueError, match="reuse=-1"):
        responses_to_reuse(0, stored, -1)


def test_regroup_normalises_over_every_round_and_the_reused_response() -> None:
    # three wrong answers and a reused right one: mean 1/4; sample std sqrt(3/4 / 3) = 1/2
    members = [ro(10, 0.0, "q"), ro(10, 0.0, "q"), ro(30, 0.0, "q"), ro(99, 1.0, "q")]
    regroup(members, 10, scale_rewards=True)
    assert [r.group_id for r in members] == [10] * 4
    assert [r.advantage for r in members] == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-5)
    assert all(r.group_mean_reward == pytest.approx(0.25) for r in members)
    regroup(members, 10, scale_rewards=False)  # Dr.GRPO: centred only
    assert [r.advantage for r in members] == pytest.approx([-0.25, -0.25, -0.25, 0.75])


# -- the store ----------------------------------------------------------------------------------


def test_store_keeps_the_newest_correct_responses_per_prompt_and_the_recent_prompts() -> None:
    s = CorrectResponseStore(per_prompt=2, max_prompts=2)
    a1, a2, a3 = (ro(0, 1.0, "a", version=v) for v in (1, 2, 3))
    s.add([a1, ro(0, 0.0, "a"), a2, a3])  # the wrong one is not kept
    assert s.get("a") == [a2, a3] and s.added == 3 and s.dropped == 1
    s.add([ro(1, 1.0, "b")])
    s.add([ro(2, 1.0, "c")])  # three prompts: "a", updated least recently, goes
    assert s.get("a") == [] and len(s.get("b")) == len(s.get("c")) == 1 and s.dropped == 3
    again = CorrectResponseStore(per_prompt=2, max_prompts=2)
    again.load_state_dict(copy.deepcopy(s.state_dict()))
    assert [r.policy_version for r in again.get("c")] == [0]
    assert again.stats() == s.stats()
    again.add([ro(3, 1.0, "d")])  # the order of prompts came back too: "b" goes next
    assert again.get("b") == [] and len(again.get("c")) == 1


# -- the batch source ---------------------------------------------------------------------------


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
    """Each call: for prompt text j of the call, the scripted rewards (k of them)."""

    def __init__(self, script: list[dict[str, list[float]]]) -> None:
        self.script, self.calls = list(script), []

    def produce(self, version: int, step: int, base: int, texts: list[str], k: int):
        self.calls.append((version, step, base, list(texts), k))
        answers = self.script.pop(0)
        rs = [ro(base + j, x, t, version) for j, t in enumerate(texts) for x in answers[t]]
        assert all(len(answers[t]) == k for t in texts)
        return FakeProduction(rs, generated=len(rs), tokens=2 * len(rs))


class FakeLearner:
    def current_logprobs(self, rollouts: list[Rollout]) -> list[torch.Tensor]:
        return [torch.full((r.num_completion_tokens,), -0.25) for r in rollouts]


def _source(producer: FakeProducer | None, **ar: object) -> tuple[Ar3poSource, Counters]:
    cfg = Ar3poConfig(**{"max_rounds": 3, **ar})  # type: ignore[arg-type]
    src = Ar3poSource(
        OnPolicyQueue(),
        producer.produce if producer else None,
        CorrectResponseStore(cfg.store_per_prompt, cfg.store_prompts),
        per_round=2,
        prompts_per_call=3,
        epochs=1,
        scale_rewards=True,
        ar=cfg,
    )
    return src, Counters()


def _step(src: Ar3poSource, c: Counters, first: dict[str, list[float]], step: int, learner=None):
    c.step = step
    src.before_step(learner, c, lambda _: None)
    base = step * 1_000_000
    fresh = [ro(base + j, x, t) for j, t in enumerate(first) for x in first[t]]
    c.account(FakeProduction(fresh, generated=len(fresh), tokens=2 * len(fresh)))
    return src.next_batch(fresh, version=step)


def test_rounds_go_to_unsolved_prompts_only_and_every_response_is_counted() -> None:
    # round 1 (the loop's): "easy" solved, "mid" and "hard" not; round 2 solves "mid";
    # round 3 is for "hard" alone, which stays unsolved (nothing stored yet to reuse)
    producer = FakeProducer([{"mid": [1, 0], "hard": [0, 0]}, {"hard": [0, 0]}])
    src, c = _source(producer)
    batch, epochs = _step(src, c, {"easy": [1, 1], "mid": [0, 0], "hard": [0, 0]}, step=5)
    assert [call[2:] for call in producer.calls] == [
        (5_000_003, ["mid", "hard"], 2),  # round index 1 x 3 prompts per call
        (5_000_006, ["hard"], 2),
    ]
    by_prompt = {t: [r for r in batch if r.prompt_text == t] for t in ("easy", "mid", "hard")}
    assert [len(v) for v in by_prompt.values()] == [2, 4, 6]  # easy costs k, hard the cap
    # one group per prompt with the first round's id; "mid" normalised over its 4 responses
    assert {r.group_id for r in by_prompt["mid"]} == {5_000_001}
    mid = sorted(r.advantage for r in by_prompt["mid"])
    assert mid == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-5)
    assert all(r.advantage == 0 for r in by_prompt["hard"] + by_prompt["easy"])
    assert epochs == 1 and c.count("generation_rounds") == 2 and c.rollouts_generated == 12
    assert c.count("rollouts_reused") == 0
    led = ledger(c, src.buffers())
    assert led["balanced"] and led["consumed"] == 12 == led["generated"]
    assert len(src.store) == 2  # the newest correct response of "easy" and of "mid"


def test_an_unsolved_group_gets_a_stored_correct_response_counted_as_reused() -> None:
    src, c = _source(None, store_per_prompt=1, reuse_logprobs="behaviour")
    _step(src, c, {"q": [1, 0], "r": [0, 0]}, step=0)  # "q" solved: stored
    stored = src.store.get("q")[0]
    batch, _ = _step(src, c, {"q": [0, 0], "r": [0, 0]}, step=1)
    q = [r for r in batch if r.prompt_text == "q"]
    assert len(q) == 3 and sum(r.correct for r in q) == 1
    reused = next(r for r in q if r.correct)
    assert reused is not stored and reused.policy_version == stored.policy_version == 0
    assert reused.group_id == 1_000_000 and reused.advantage == pytest.approx(2 / 3**0.5, 1e-4)
    assert torch.equal(reused.behaviour_logprobs, stored.behaviour_logprobs)  # behaviour
    assert stored.group_id == 0 and stored.times_sampled == 2  # trained fresh, then reused
    assert c.count("rollouts_reused") == 1 and c.rollouts_generated == 8  # reused: not generated
    assert ledger(c, src.buffers())["balanced"] and src.store.reused == 1
    assert all(r.advantage == 0 for r in batch if r.prompt_text == "r")  # nothing stored


def test_reuse_logprobs_current_takes_the_policy_at_reuse_and_reuse_zero_turns_it_off() -> None:
    src, c = _source(None)  # reuse_logprobs = current (default)
    _step(src, c, {"q": [1, 0]}, step=0, learner=FakeLearner())
    batch, _ = _step(src, c, {"q": [0, 0]}, step=1, learner=FakeLearner())
    reused = next(r for r in batch if r.correct)
    assert torch.equal(reused.behaviour_logprobs, torch.full((2,), -0.25))
    assert torch.equal(src.store.get("q")[0].behaviour_logprobs, torch.full((2,), -1.0))
    off, c2 = _source(None, reuse=0)
    _step(off, c2, {"q": [1, 0]}, step=0)
    batch, _ = _step(off, c2, {"q": [0, 0]}, step=1)
    assert len(batch) == 2 and c2.count("rollouts_reused") == 0


@pytest.mark.parametrize("mode", ["current", "behaviour"])
def test_a_reused_copy_keeps_sampler_logprobs_only_with_its_own_behaviour(mode: str) -> None:
    # reduced precision stores the sampler's log-probs beside the learner's refreshed ones;
    # truncated IS weighs w = min(exp(behaviour - sampler), cap) (learner/frozen_passes.py).
    # current: behaviour = the policy now (-0.25), so the old sampler's (-3) would give
    # w = min(e^2.75, 2) = 2; dropped, w = 1. behaviour: both from generation, w = e^-0.5
    from replayrl.algorithms.correction import truncated_is_weights

    src, c = _source(None, reuse_logprobs=mode)
    _step(src, c, {"q": [1, 0]}, step=0, learner=FakeLearner())
    stored = src.store.get("q")[0]
    stored.behaviour_logprobs = torch.full((2,), -3.5)
    stored.extras["sampler_logprobs"] = torch.full((2,), -3.0)
    batch, _ = _step(src, c, {"q": [0, 0]}, step=1, learner=FakeLearner())
    reused = next(r for r in batch if r.correct)
    sampler = reused.extras.get("sampler_logprobs", reused.behaviour_logprobs)
    w = truncated_is_weights(reused.behaviour_logprobs, sampler, 2.0)
    want = 1.0 if mode == "current" else float(torch.exp(torch.tensor(-0.5)))
    assert torch.allclose(w, torch.full((2,), want))
    assert "sampler_logprobs" in stored.extras  # the stored response is not changed


def test_stop_correct_and_max_rounds_decide_the_rounds() -> None:
    producer = FakeProducer([{"q": [1, 0]}])
    src, c = _source(producer, stop_correct=2, max_rounds=2)
    batch, _ = _step(src, c, {"q": [1, 0]}, step=0)  # one correct of two: not yet enough
    assert len(producer.calls) == 1 and len(batch) == 4  # and max_rounds=2 ends it there
    one, c1 = _source(FakeProducer([]), max_rounds=1)
    assert len(_step(one, c1, {"q": [0, 0]}, step=0)[0]) == 2 and c1.count("generation_rounds") == 0


def test_the_store_state_resumes_the_same_reuse() -> None:
    src, c = _source(None)
    _step(src, c, {"q": [1, 0]}, step=0)
    state = copy.deepcopy(src.state_dict())
    again, c2 = _source(None)
    again.load_state_dict(state)
    b1, _ = _step(src, c, {"q": [0, 0]}, step=1)
    b2, _ = _step(again, c2, {"q": [0, 0]}, step=1)
    assert [(r.reward, r.advantage, r.group_id) for r in b1] == [
        (r.reward, r.advantage, r.group_id) for r in b2
    ]


# -- config -------------------------------------------------------------------------------------


def test_preset_and_settings_it_cannot_honour() -> None:
    cfg = load_config("ar3po")
    grpo = load_config("grpo")
    assert cfg.method.name == "ar3po" and cfg.method.ar3po.max_rounds == 4
    assert (cfg.task, cfg.model.warmstart, cfg.train.steps) == (
        grpo.task,
        grpo.model.warmstart,
        grpo.train.steps,
    )
    assert cfg.rollout.prompts_per_step == grpo.rollout.prompts_per_step
    with pytest.raises(ConfigError, match="leave train.batch_size unset"):
        load_config("ar3po", ["train.batch_size=64"])
    with pytest.raises(ConfigError, match="smaller than the 272 rollouts"):
        load_config("ar3po", ["buffer.capacity=100"])  # 16 x (4 x 4 + 1)
    with pytest.raises(ConfigError, match="runtime=sync"):
        load_config("ar3po", ["runtime=async-local"])
    # reusing more than the store keeps per prompt would be capped silently
    with pytest.raises(ConfigError, match="reuse=2 is more than the 1 correct responses"):
        load_config("ar3po", ["method.ar3po.reuse=2"])
    load_config("ar3po", ["method.ar3po.reuse=2", "method.ar3po.store_per_prompt=2"])


def test_config_keys_reach_the_source() -> None:
    from replayrl.run.components import build_batch_source

    over = ["method.ar3po.max_rounds=2", "method.ar3po.stop_correct=3", "method.ar3po.reuse=0"]
    over += ["method.ar3po.store_per_prompt=5", "method.ar3po.store_prompts=7"]
    over += ["method.ar3po.reuse_logprobs=behaviour", "rollout.num_generations=3"]
    src = build_batch_source(load_config("ar3po", over), OnPolicyQueue())
    assert isinstance(src, Ar3poSource)
    assert (src.ar.max_rounds, src.ar.stop_correct, src.ar.reuse) == (2, 3, 0)
    assert (src.store.per_prompt, src.store.max_prompts) == (5, 7)
    assert src.ar.reuse_logprobs == "behaviour" and src.per_round == 3
    assert src.prompts_per_call == 16 and src.produce is None


# -- end to end ---------------------------------------------------------------------------------


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_ar3po_trains_through_the_cli_and_counts_every_round(tmp_path: Path) -> None:
    from replayrl.cli.main import main
    from tiny import TINY_RUN

    argv = [*TINY_RUN, "train.threads=1", "train.steps=3", f"logging.run_dir={tmp_path}"]
    argv += ["rollout.num_generations=2", "logging.name=ar3po"]
    assert main(["train", "--config", "ar3po", *argv]) == 0
    s = _summary(tmp_path / "ar3po")
    led = s["accounting"]["ledger"]
    # 2 prompts x 2 per round; the tiny model rarely answers right: extra rounds happen
    assert s["steps"] == 3 and led["balanced"] and s["generation_rounds_extra"] >= 1
    assert s["rollouts_generated"] == led["generated"] == led["consumed"]
    assert 3 * 4 < s["rollouts_generated"] <= 3 * 2 * 4 * 2


def test_ar3po_through_the_api_crash_and_resume_equals_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store survives a checkpoint: a run that crashes after step 3 and resumes from
    step 2 logs what the whole run logged. The tiny model is almost never right, so a
    completion counts as correct here when it starts with 0, 1 or 2, and the prompts are
    drawn from two: some are solved (stored), later all-wrong groups reuse them."""
    from replayrl.rollout.tasks.arithmetic import ArithmeticTask
    from tiny import TINY_RUN, crash_and_resume

    monkeypatch.setattr(
        ArithmeticTask, "is_correct", lambda self, text, row: text.strip()[:1] in "012"
    )
    two = lambda self, n, rng: [self.make_row(int(a), 1) for a in rng.integers(0, 2, size=n)]  # noqa: E731
    monkeypatch.setattr(ArithmeticTask, "sample_train", two)  # prompts recur: reuse can happen
    over = [*TINY_RUN, "train.threads=1", "rollout.num_generations=2", "checkpoint.every=1"]
    over += ["rewards=[{name: digits_format}]", "method.ar3po.max_rounds=2"]
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, "ar3po", over
    )
    assert crash_steps == whole_steps and len(whole_steps) == 4
    for key in ("rollouts_generated", "rollouts_reused", "generation_rounds_extra"):
        assert resumed[key] == whole[key]
    assert resumed["accounting"]["ledger"] == whole["accounting"]["ledger"]
    assert whole["accounting"]["ledger"]["balanced"]
    assert whole["rollouts_reused"] > 0 and whole["generation_rounds_extra"] > 0
