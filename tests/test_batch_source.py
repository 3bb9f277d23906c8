"""The batch source component (batch_source.py) on its own, with recording stand-in buffers:
paper 1's buffer source, and ReMix's (arXiv 2507.06892) fresh + window mix with policy
reincarnation at step T. Counts are hand-computed from the formulas in the docstrings."""

from __future__ import annotations

from typing import Any

import pytest

from replayrl.methods.buffer import BufferSource
from replayrl.methods.remix import RemixConfig, RemixSource
from replayrl.run.state import Counters


class RecordingBuffer:
    """push/sample like a replay buffer (sample: the oldest n, without removal), recording
    every call, so a test sees what the source asked for and in which order."""

    kind = "onpolicy"

    def __init__(self, items: list[Any] | None = None) -> None:
        self.items = list(items or [])
        self.calls: list[tuple[str, Any, Any]] = []
        self.loaded: dict[str, Any] | None = None

    def push(self, rollouts: list[Any]) -> None:
        self.calls.append(("push", list(rollouts), None))
        self.items += rollouts

    def sample(self, n: int, current_version: int | None = None) -> list[Any]:
        self.calls.append(("sample", n, current_version))
        return self.items[:n]

    def stats(self) -> dict[str, float]:
        return {"size": float(len(self.items)), "pushed": 0.0, "consumed": 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"items": list(self.items)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state
        self.items = list(state["items"])


class CountingLearner:
    """The learner as a method sees it (`LearnerPort`), counting reincarnations."""

    def __init__(self) -> None:
        self.reincarnations = 0
        self.version = 0

    def reincarnate(self) -> None:
        self.reincarnations += 1


def _remix(
    p: float = 0.5,
    T: int | None = 3,
    window: list[Any] | None = None,
    composition: str = "additive",
    at: float | None = None,
) -> RemixSource:
    rm = RemixConfig(
        off_policy_fraction=p,
        utd=2,
        utd_after=1,
        reincarnation_step=T,
        reincarnation_at=at,
        composition=composition,
    )
    return RemixSource(
        RecordingBuffer(),
        RecordingBuffer(window),
        batch_size=4,
        rm=rm,
        budget=100,
        prompts_per_step=8,
    )


def test_buffer_source_pushes_then_samples_b_with_the_version() -> None:
    buf = RecordingBuffer(["old"])
    src = BufferSource(buf, batch_size=2, epochs=3)
    learner = CountingLearner()
    src.before_step(learner, Counters(step=5), print)
    assert learner.reincarnations == 0  # paper 1's source never touches the policy
    batch, passes = src.next_batch(["a", "b"], version=7)
    assert buf.calls == [("push", ["a", "b"], None), ("sample", 2, 7)]
    assert batch == ["old", "a"] and passes == 3
    assert src.buffers() == [buf]
    assert src.state_dict() == {"buffer": {"items": ["old", "a", "b"]}}
    src.load_state_dict({"buffer": {"items": ["x"]}})
    assert buf.items == ["x"]


@pytest.mark.parametrize(
    ("p", "fresh", "n_stale"),
    # n_stale = round(p / (1 - p) * R): p of the batch replayed, 1 - p fresh
    [(0.5, 4, 4), (0.25, 6, 2), (0.4, 3, 2), (0.2, 2, 0)],
)
def test_remix_batch_is_fresh_plus_a_share_p_from_the_window(
    p: float, fresh: int, n_stale: int
) -> None:
    src = _remix(p, window=[f"w{i}" for i in range(10)])
    src.before_step(CountingLearner(), Counters(step=1), print)
    new = [f"f{i}" for i in range(fresh)]
    batch, passes = src.next_batch(new, version=9)
    assert batch == new + [f"w{i}" for i in range(n_stale)]
    assert passes == 2  # m = utd before T
    window = src.window
    assert window is not None
    sampled = [("sample", n_stale, 9)] if n_stale else []
    # sampled before the push: this step's fresh rollouts are never their own stale share
    assert window.calls == [*sampled, ("push", new, None)]
    assert src.buffer.calls == []  # the main buffer is not used while mixing


def test_reincarnation_happens_once_at_step_t_and_drops_the_window() -> None:
    src = _remix(T=3, window=["w0", "w1", "w2"])
    learner, counters, logs = CountingLearner(), Counters(), []
    for step in (0, 1, 2):
        counters.step = step
        src.before_step(learner, counters, logs.append)
        assert src.mixing and learner.reincarnations == 0
    counters.step = 3
    src.before_step(learner, counters, logs.append)
    assert learner.reincarnations == 1
    assert src.window is None and not src.mixing
    assert counters.reincarnation_step == 3
    assert counters.count("rollouts_discarded") == 3  # the window's contents, retired to the ledger
    assert logs == ["policy reincarnation at step 3: pi_base <- pi_3, p = 0"]
    src.before_step(learner, counters, logs.append)  # the same step again: not twice
    assert learner.reincarnations == 1
    # from T on: plain on-policy batches from the main buffer, utd_after passes
    batch, passes = src.next_batch(["a", "b", "c", "d", "e"], version=4)
    assert batch == ["a", "b", "c", "d"] and passes == 1
    assert src.buffer.calls[-1] == ("sample", 4, 4)
    assert src.buffers() == [src.buffer]


def test_remix_without_t_mixes_for_ever_and_past_t_does_not_mix() -> None:
    never = _remix(T=None, window=["w"])
    learner, counters = CountingLearner(), Counters(step=10_000)
    never.before_step(learner, counters, print)
    assert never.mixing and learner.reincarnations == 0
    # resumed past T with a window still there (not at T): no mixing, no reincarnation
    late = _remix(T=3, window=["w"])
    late.before_step(learner, Counters(step=4), print)
    assert not late.mixing and learner.reincarnations == 0
    assert late.next_batch(["a"], version=0)[1] == 1


def test_remix_state_round_trip_keeps_or_drops_the_window() -> None:
    src = _remix(window=["w0"])
    state = src.state_dict()
    assert state == {"buffer": {"items": []}, "window": {"items": ["w0"]}}
    assert src.buffers() == [src.buffer, src.window]
    other = _remix(window=[])
    other.load_state_dict(state)
    assert other.window is not None and other.window.items == ["w0"]
    other.load_state_dict({"buffer": {"items": []}, "window": None})  # saved after T
    assert other.window is None
    assert other.state_dict() == {"buffer": {"items": []}, "window": None}


@pytest.mark.parametrize(
    ("p", "prompts", "fresh", "n_stale"),
    # fixed composition (paper 2, sec. 3.1), P = 8 prompts, B = 4 rollouts: round((1 - p) 8)
    # prompts generated; the window fills B - fresh (none when fresh already fills B)
    [(0.5, 4, 2, 2), (0.25, 6, 3, 1), (0.4, 5, 1, 3), (0.5, 4, 5, 0)],
)
def test_fixed_composition_generates_1_minus_p_and_fills_b_from_the_window(
    p: float, prompts: int, fresh: int, n_stale: int
) -> None:
    src = _remix(p, window=[f"w{i}" for i in range(10)], composition="fixed")
    src.before_step(CountingLearner(), Counters(step=1), print)
    assert src.prompts_this_step() == prompts
    new = [f"f{i}" for i in range(fresh)]
    batch, passes = src.next_batch(new, version=9)
    assert batch == new + [f"w{i}" for i in range(n_stale)] and passes == 2


def test_fixed_composition_generates_all_p_prompts_after_reincarnation() -> None:
    src = _remix(0.5, T=2, window=["w"], composition="fixed")
    src.before_step(CountingLearner(), Counters(step=2), print)
    assert not src.mixing and src.prompts_this_step() is None  # the config's P again
    additive = _remix(0.5, T=2, window=["w"])
    additive.before_step(CountingLearner(), Counters(step=1), print)
    assert additive.mixing and additive.prompts_this_step() is None  # R fresh every step


def test_reincarnation_at_a_share_of_the_generated_budget() -> None:
    # budget 100 rollouts, at = 0.3: the first step starting with >= 30 generated
    src = _remix(T=None, window=["w0", "w1"], at=0.3)
    learner, counters = CountingLearner(), Counters()
    for step, generated in enumerate((0, 10, 20, 29)):
        counters.step, counters.rollouts_generated = step, generated
        src.before_step(learner, counters, print)
        assert src.mixing and learner.reincarnations == 0
    counters.step, counters.rollouts_generated = 4, 30
    src.before_step(learner, counters, print)
    assert learner.reincarnations == 1 and counters.reincarnation_step == 4 and not src.mixing
    counters.step, counters.rollouts_generated = 5, 40  # still past: not twice
    src.before_step(learner, counters, print)
    assert learner.reincarnations == 1


def test_reincarnation_at_needs_a_budget_and_fixed_needs_p() -> None:
    rm = RemixConfig(reincarnation_step=None, reincarnation_at=0.5)
    with pytest.raises(ValueError, match="budget"):
        RemixSource(RecordingBuffer(), RecordingBuffer(), 4, rm, prompts_per_step=2)
    with pytest.raises(ValueError, match="prompts_per_step"):
        RemixSource(RecordingBuffer(), RecordingBuffer(), 4, RemixConfig())
