"""Tests for replayrl.data.buffer: model-based property tests plus worked examples."""

from __future__ import annotations

import io
import math
import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayrl.data.buffer import (
    Buffer,
    OnPolicyQueue,
    ReplayBuffer,
    ShardedBuffer,
    batch_stats,
    draw_indices,
    make_buffer,
    positive_bias,
    rollout_to_dict,
    uniform,
)
from replayrl.data.buffer.samplers import num_reserved
from replayrl.data.rollout_record import Rollout

PROPS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_ZL = torch.zeros(2, dtype=torch.long)
_ZF = torch.zeros(2)


def mk(i: int, correct: bool = False, version: int = 0) -> Rollout:
    """A tiny rollout whose identity is ``step == group_id == i``."""
    return Rollout(
        prompt_ids=_ZL.clone(),
        completion_ids=_ZL.clone(),
        behaviour_logprobs=_ZF.clone(),
        reward=float(correct),
        advantage=0.0,
        correct=correct,
        group_id=i,
        policy_version=version,
        step=i,
    )


def ids(rs: list[Rollout]) -> list[int]:
    return [r.step for r in rs]


# --------------------------------------------------------------------------------------------
# op sequences: ("push", [(correct, version), ...]) or ("sample", n, current_version | None)
# --------------------------------------------------------------------------------------------
push_op = st.tuples(
    st.just("push"),
    st.lists(st.tuples(st.booleans(), st.integers(0, 12)), min_size=0, max_size=7),
)
sample_op = st.tuples(
    st.just("sample"), st.integers(0, 9), st.one_of(st.none(), st.integers(0, 15))
)
ops_strategy = st.lists(st.one_of(push_op, sample_op), min_size=1, max_size=25)


class Pusher:
    """Hands out rollouts with globally increasing ids."""

    def __init__(self) -> None:
        self.next = 0

    def make(self, spec: list[tuple[bool, int]]) -> list[Rollout]:
        out = [mk(self.next + j, c, v) for j, (c, v) in enumerate(spec)]
        self.next += len(spec)
        return out


def reserve_slots(capacity: int, delta: float) -> int:
    """k = floor(delta * N), written independently (never more than N - 1)."""
    return min(capacity - 1, math.floor(delta * capacity + 1e-9))


class FifoModel:
    """Reference buffer as plain lists: a fresh window of N - k and a correct reserve of k.

    A rollout pushed out of the window joins the reserve if it is correct (the reserve's
    oldest then leaves if there are more than k), else it is evicted. k = 0: a plain FIFO.
    """

    def __init__(self, capacity: int, delta: float = 0.0) -> None:
        self.k = reserve_slots(capacity, delta)
        self.window = capacity - self.k
        self.fresh: list[Rollout] = []
        self.reserve: list[Rollout] = []
        self.evicted = 0

    def push(self, rollouts: list[Rollout]) -> None:
        for r in rollouts:
            self.fresh.append(r)
            if len(self.fresh) > self.window:
                old = self.fresh.pop(0)
                if self.k and old.correct:
                    self.reserve.append(old)
                    if len(self.reserve) > self.k:
                        self.reserve.pop(0)
                        self.evicted += 1
                else:
                    self.evicted += 1

    def drop_stale(self, cv: int | None, ms: int | None) -> int:
        before = len(self.items())
        self.fresh = drop_stale(self.fresh, cv, ms)
        self.reserve = drop_stale(self.reserve, cv, ms)
        return before - len(self.items())

    def remove(self, gone: set[int]) -> None:
        self.fresh = [r for r in self.fresh if r.step not in gone]
        self.reserve = [r for r in self.reserve if r.step not in gone]

    def items(self) -> list[Rollout]:
        return self.reserve + self.fresh


def literal_candidates(history: list[Rollout], capacity: int, delta: float) -> list[Rollout]:
    """Paper 1 verbatim over everything ever pushed (no staleness filter): the freshest
    (1-delta)N rollouts plus the freshest delta*N correct rollouts not already among them."""
    k = reserve_slots(capacity, delta)
    n_fresh = capacity - k
    fresh = history[max(0, len(history) - n_fresh) :]
    older_correct = [r for r in history[: len(history) - len(fresh)] if r.correct]
    extras = older_correct[max(0, len(older_correct) - k) :] if k else []
    return extras + fresh


def drop_stale(items: list[Rollout], cv: int | None, ms: int | None) -> list[Rollout]:
    if ms is None or cv is None:
        return items
    return [r for r in items if cv - r.policy_version <= ms]


# --------------------------------------------------------------------------------------------
# replay buffer: model-based property test
# --------------------------------------------------------------------------------------------
@PROPS
@given(
    ops=ops_strategy,
    capacity=st.integers(1, 9),
    delta=st.sampled_from([0.0, 0.2, 0.5, 0.75, 0.9]),
    with_replacement=st.booleans(),
    max_staleness=st.one_of(st.none(), st.integers(0, 4)),
    seed=st.integers(0, 3),
)
def test_replay_matches_model(
    ops: list[Any],
    capacity: int,
    delta: float,
    with_replacement: bool,
    max_staleness: int | None,
    seed: int,
) -> None:
    sampler = "positive_bias" if delta > 0 else "uniform"
    buf = make_buffer(
        "replay",
        capacity,
        sampler=sampler,
        delta=delta,
        with_replacement=with_replacement,
        max_staleness=max_staleness,
        seed=seed,
    )
    assert isinstance(buf, ReplayBuffer)
    model = FifoModel(capacity, delta)
    assert (buf.reserve_capacity, buf.fresh_capacity) == (model.k, model.window)
    history: list[Rollout] = []
    pusher = Pusher()
    dropped = consumed = 0
    uses: Counter[int] = Counter()
    for op in ops:
        if op[0] == "push":
            new = pusher.make(op[1])
            buf.push(new)
            model.push(new)
            history.extend(new)
        else:
            _, n, cv = op
            dropped += model.drop_stale(cv, max_staleness)
            cands = model.items()
            assert ids(buf.candidates(cv)) == ids(cands)
            batch = buf.sample(n, cv)
            cand_ids = set(ids(cands))
            assert set(ids(batch)) <= cand_ids  # only present candidates
            if with_replacement:
                assert len(batch) == (n if cands else 0)
            else:
                assert len(batch) == min(n, len(cands))
                assert len(set(ids(batch))) == len(batch)
                if n >= len(cands):
                    assert set(ids(batch)) == cand_ids  # every candidate can be returned
            consumed += len(batch)
            uses.update(ids(batch))
        assert len(buf) <= capacity
        assert ids(buf.reserve_items()) == ids(model.reserve)
        assert ids(buf.fresh_items()) == ids(model.fresh)
        assert ids(buf.items()) == ids(model.items())  # sampling never removes; push order
        assert ids(buf.items()) == sorted(ids(buf.items()))
        assert all(r.correct for r in buf.reserve_items())
        if dropped == 0:  # without staleness drops: exactly the paper's rule, verbatim
            assert ids(buf.items()) == ids(literal_candidates(history, capacity, delta))
    for r in buf.items():
        assert r.times_sampled == uses[r.step]
    s = buf.stats()
    assert (s["size"], s["capacity"], s["pushed"]) == (len(model.items()), capacity, pusher.next)
    assert (s["evicted"], s["dropped_stale"], s["consumed"]) == (model.evicted, dropped, consumed)
    assert (s["candidates"], s["reserve_size"]) == (len(model.items()), len(model.reserve))


# --------------------------------------------------------------------------------------------
# on-policy queue: model-based property test
# --------------------------------------------------------------------------------------------
@PROPS
@given(
    ops=ops_strategy,
    capacity=st.one_of(st.none(), st.integers(1, 9)),
    max_staleness=st.one_of(st.none(), st.integers(0, 4)),
)
def test_onpolicy_matches_model(
    ops: list[Any], capacity: int | None, max_staleness: int | None
) -> None:
    buf = make_buffer("onpolicy", capacity, max_staleness=max_staleness)
    assert isinstance(buf, OnPolicyQueue)
    model: list[Rollout] = []
    pusher = Pusher()
    evicted = dropped = consumed = 0
    for op in ops:
        if op[0] == "push":
            new = pusher.make(op[1])
            buf.push(new)
            model.extend(new)
            while capacity is not None and len(model) > capacity:
                model.pop(0)
                evicted += 1
        else:
            _, n, cv = op
            kept = drop_stale(model, cv, max_staleness)
            dropped += len(model) - len(kept)
            model = kept
            batch = buf.sample(n, cv)
            k = min(n, len(model))
            expected = model[len(model) - k :][::-1]  # LIFO: freshest first
            assert ids(batch) == ids(expected)
            assert all(r.times_sampled == 1 for r in batch)
            model = model[: len(model) - k]  # always removed
            consumed += k
        if capacity is not None:
            assert len(buf) <= capacity
        assert ids(buf.items()) == ids(model)
    s = buf.stats()
    assert (s["pushed"], s["evicted"], s["dropped_stale"]) == (pusher.next, evicted, dropped)
    assert s["consumed"] == consumed
    assert s["capacity"] == (math.inf if capacity is None else capacity)


# --------------------------------------------------------------------------------------------
# sharded: partition, per-shard FIFO, shard-local and global sampling
# --------------------------------------------------------------------------------------------
@PROPS
@given(
    ops=st.lists(
        st.one_of(push_op, st.tuples(st.just("sample"), st.integers(0, 6), st.none())),
        min_size=1,
        max_size=20,
    ),
    kind=st.sampled_from(["replay", "onpolicy", "positive_bias"]),
    num_shards=st.integers(1, 3),
    per_shard=st.integers(1, 4),
    shard_choice=st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=20, max_size=20),
)
def test_sharded_partition(
    ops: list[Any],
    kind: str,
    num_shards: int,
    per_shard: int,
    shard_choice: list[int | None],
) -> None:
    capacity = num_shards * per_shard
    delta = 0.5 if kind == "positive_bias" else 0.0
    extra = {"sampler": "positive_bias", "delta": delta} if delta else {}
    real_kind = "onpolicy" if kind == "onpolicy" else "replay"
    buf = make_buffer(real_kind, capacity, num_shards=num_shards, seed=7, **extra)
    shards = buf.shards if isinstance(buf, ShardedBuffer) else [buf]
    assert len(shards) == num_shards
    models = [FifoModel(per_shard, delta) for _ in range(num_shards)]
    pusher = Pusher()
    for op, choice in zip(ops, shard_choice, strict=False):
        if op[0] == "push":
            new = pusher.make(op[1])
            buf.push(new)
            for r in new:  # round-robin routing: push p goes to shard p % T
                models[r.step % num_shards].push([r])
        else:
            n = op[1]
            present = {r.step for m in models for r in m.items()}
            if choice is not None and isinstance(buf, ShardedBuffer):
                i = choice % num_shards
                batch = buf.sample(n, shard=i)
                assert all(r.step % num_shards == i for r in batch)
            else:
                batch = buf.sample(n)
            assert set(ids(batch)) <= present
            if real_kind == "onpolicy":
                if choice is None or not isinstance(buf, ShardedBuffer):
                    # global LIFO across shards: the freshest overall, freshest first
                    assert ids(batch) == sorted(present, reverse=True)[: len(batch)]
                    assert len(batch) == min(n, len(present))
                for m in models:
                    m.remove(set(ids(batch)))
            elif choice is None or not isinstance(buf, ShardedBuffer):
                assert len(batch) == min(n, len(present))  # union of windows and reserves
                assert len(set(ids(batch))) == len(batch)
        for i, s in enumerate(shards):
            assert len(s) <= per_shard
            assert ids(s.items()) == ids(models[i].items())  # per-shard window (+ reserve)
        # every stored item is in exactly one shard, the one its push index names
        stored = [r.step for s in shards for r in s.items()]
        assert len(stored) == len(set(stored))
        assert all(step % num_shards == i for i, s in enumerate(shards) for step in ids(s.items()))
    assert buf.stats()["pushed"] == pusher.next
    assert sum(s.stats()["pushed"] for s in shards) == pusher.next
    if real_kind == "replay":
        st_ = buf.stats()
        assert st_["reserve_size"] == sum(len(m.reserve) for m in models)
        assert st_["evicted"] == sum(m.evicted for m in models)


# --------------------------------------------------------------------------------------------
# state_dict round-trip (through torch.save / torch.load(weights_only=True))
# --------------------------------------------------------------------------------------------
CONFIGS: list[dict[str, Any]] = [
    {"kind": "replay", "capacity": 6},
    {"kind": "replay", "capacity": 6, "with_replacement": True},
    {"kind": "replay", "capacity": 8, "sampler": "positive_bias", "delta": 0.5},
    {"kind": "replay", "capacity": 6, "max_staleness": 2},
    {"kind": "onpolicy", "capacity": 5, "max_staleness": 3},
    {"kind": "onpolicy", "capacity": None},
    {"kind": "replay", "capacity": 6, "num_shards": 3, "sampler": "positive_bias", "delta": 0.5},
    {"kind": "replay", "capacity": 6, "num_shards": 2, "with_replacement": True},
    {"kind": "onpolicy", "capacity": 6, "num_shards": 2},
]


def run_ops(buf: Buffer, ops: list[Any], start: int) -> list[list[int]]:
    """Apply ops (rollout ids from ``start``); return the sampled id lists."""
    pusher = Pusher()
    pusher.next = start
    out = []
    for op in ops:
        if op[0] == "push":
            buf.push(pusher.make(op[1]))
        else:
            out.append(ids(buf.sample(op[1], op[2])))
    return out


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


@settings(PROPS, max_examples=25)
@given(before=ops_strategy, after=ops_strategy, config=st.sampled_from(CONFIGS))
def test_state_dict_roundtrip(before: list[Any], after: list[Any], config: dict[str, Any]) -> None:
    kw = {k: v for k, v in config.items() if k not in ("kind", "capacity")}
    a = make_buffer(config["kind"], config["capacity"], seed=1, **kw)
    run_ops(a, before, 0)
    state = roundtrip(a.state_dict())
    b = make_buffer(config["kind"], config["capacity"], seed=99, **kw)  # other seed on purpose
    b.load_state_dict(state)
    assert len(b) == len(a) and b.stats() == a.stats()
    assert run_ops(a, after, 1000) == run_ops(b, after, 1000)
    assert a.stats() == b.stats()
    shards_a = a.shards if isinstance(a, ShardedBuffer) else [a]
    shards_b = b.shards if isinstance(b, ShardedBuffer) else [b]
    for sa, sb in zip(shards_a, shards_b, strict=True):
        assert [(r.step, r.times_sampled) for r in sa.items()] == [
            (r.step, r.times_sampled) for r in sb.items()
        ]


def test_state_dict_keeps_rollout_fields_and_rejects_other_config() -> None:
    a = ReplayBuffer(4, seed=3)
    r = mk(5, correct=True, version=2)
    r.extras["why"] = "x"
    r.completion_text = "hi"
    a.push([r, r])  # the same object twice stays one object after a round-trip
    a.sample(1)
    b = ReplayBuffer(4)
    b.load_state_dict(roundtrip(a.state_dict()))
    x, y = b.items()
    assert x is y and x is not r
    assert (x.step, x.correct, x.policy_version, x.extras, x.completion_text) == (
        5,
        True,
        2,
        {"why": "x"},
        "hi",
    )
    assert x.times_sampled == r.times_sampled == 1
    assert torch.equal(x.prompt_ids, r.prompt_ids)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(5).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="kind"):
        OnPolicyQueue(4).load_state_dict(a.state_dict())


# --------------------------------------------------------------------------------------------
# worked examples
# --------------------------------------------------------------------------------------------
def test_fifo_capacity_4_push_6() -> None:
    buf = make_buffer("replay", 4)
    buf.push([mk(i) for i in range(6)])
    assert ids(buf.items()) == [2, 3, 4, 5]
    assert buf.stats()["evicted"] == 2 and len(buf) == 4
    batch = buf.sample(10)
    assert sorted(ids(batch)) == [2, 3, 4, 5] and len(buf) == 4  # all, once, nothing removed


def test_positive_bias_worked_example() -> None:
    # N = 8, delta = 0.25: k = 2 reserve slots, fresh window = the freshest 6 pushed.
    buf = make_buffer("replay", 8, sampler="positive_bias", delta=0.25, seed=0)
    assert isinstance(buf, ReplayBuffer)
    assert (buf.fresh_capacity, buf.reserve_capacity) == (6, 2)
    correct = {0, 1, 3, 6, 9}

    def push(*steps: int) -> None:
        buf.push([mk(i, i in correct) for i in steps])

    push(0, 1, 2, 3, 4, 5)  # window not full yet: everything is in it
    assert (ids(buf.fresh_items()), ids(buf.reserve_items())) == ([0, 1, 2, 3, 4, 5], [])
    push(6, 7)  # 0 and 1 leave the window; both correct -> reserve
    assert (ids(buf.fresh_items()), ids(buf.reserve_items())) == ([2, 3, 4, 5, 6, 7], [0, 1])
    assert buf.stats()["evicted"] == 0 and len(buf) == 8
    push(8)  # 2 leaves the window, incorrect -> evicted
    assert (ids(buf.fresh_items()), ids(buf.reserve_items())) == ([3, 4, 5, 6, 7, 8], [0, 1])
    assert buf.stats()["evicted"] == 1
    push(9)  # 3 leaves, correct -> reserve, which is full: its oldest (0) is evicted
    assert (ids(buf.fresh_items()), ids(buf.reserve_items())) == ([4, 5, 6, 7, 8, 9], [1, 3])
    # paper 1: freshest (1 - 0.25) * 8 = 6 -> {4..9}; freshest 0.25 * 8 = 2 correct not
    # among them: correct {0, 1, 3, 6, 9} minus the window -> {0, 1, 3} -> freshest 2 = {1, 3}
    assert ids(buf.items()) == ids(buf.candidates()) == [1, 3, 4, 5, 6, 7, 8, 9]
    s = buf.stats()
    assert (s["size"], s["candidates"], s["reserve_size"], s["evicted"]) == (8, 8, 2, 2)
    assert sorted(ids(buf.sample(100))) == [1, 3, 4, 5, 6, 7, 8, 9]  # all, once each
    for _ in range(20):
        assert set(ids(buf.sample(3))) <= {1, 3, 4, 5, 6, 7, 8, 9}  # 0 and 2 never
    push(10, 11, 12)  # 4, 5 leave incorrect (evicted); 6 correct -> reserve, evicts 1
    assert (ids(buf.fresh_items()), ids(buf.reserve_items())) == ([7, 8, 9, 10, 11, 12], [3, 6])
    assert buf.stats()["evicted"] == 5 and len(buf) == 8

    # uniform over the 8 candidates, reserve included
    wr = make_buffer("replay", 8, sampler="positive_bias", delta=0.25, with_replacement=True)
    wr.push([mk(i, i in correct) for i in range(10)])
    counts = Counter(ids(wr.sample(8000)))
    assert set(counts) == {1, 3, 4, 5, 6, 7, 8, 9}
    assert all(850 < c < 1150 for c in counts.values())


def test_positive_bias_drops_stale_from_reserve_and_window() -> None:
    # N = 6, delta = 0.5: window 3, reserve 3; versions rise with pushes
    buf = make_buffer("replay", 6, sampler="positive_bias", delta=0.5, max_staleness=2)
    buf.push([mk(i, correct=i % 2 == 0, version=i) for i in range(8)])
    assert (ids(buf.reserve_items()), ids(buf.fresh_items())) == ([0, 2, 4], [5, 6, 7])
    assert buf.stats()["evicted"] == 2  # 1 and 3
    assert ids(buf.candidates(current_version=6)) == [4, 5, 6, 7]  # 0 and 2 too old
    assert (buf.stats()["dropped_stale"], buf.stats()["reserve_size"]) == (2, 1)
    assert ids(buf.candidates(current_version=8)) == [6, 7]  # window shrinks, no refill
    buf.push([mk(8, True, 8)])  # room in the window: nothing leaves it
    assert (ids(buf.reserve_items()), ids(buf.fresh_items())) == ([], [6, 7, 8])
    buf.push([mk(9, False, 9)])  # 6 (correct) leaves the full window -> reserve
    assert (ids(buf.reserve_items()), ids(buf.fresh_items())) == ([6], [7, 8, 9])
    s = buf.stats()
    assert (s["dropped_stale"], s["evicted"], s["size"]) == (4, 2, 4)


def test_positive_bias_sampler_function() -> None:
    sampler = positive_bias(0.5)
    assert (sampler.name, sampler.delta, sampler.reserve_capacity(8)) == ("positive_bias", 0.5, 4)
    assert positive_bias(0.2).reserve_capacity(84) == 16  # paper 1: N = 84, delta = 0.2
    assert positive_bias(0.5).reserve_capacity(1) == 0  # the window keeps >= 1 slot
    assert positive_bias(0.0).reserve_capacity(10) == uniform.reserve_capacity(10) == 0
    assert num_reserved(0.29, 100) == 29 and num_reserved(0.2, 84) == 16
    assert num_reserved(0.9999999999999, 10) == 9
    with pytest.raises(ValueError, match="delta"):
        positive_bias(1.0)


def test_delta_zero_equals_uniform() -> None:
    a = make_buffer("replay", 10, seed=5)
    b = make_buffer("replay", 10, sampler="positive_bias", delta=0.0, seed=5)
    c = make_buffer("replay", 10, sampler="positive_bias", delta=0.05, seed=5)  # k = 0 too
    for buf in (a, b, c):
        buf.push([mk(i, i % 2 == 0) for i in range(15)])
    draws = [[ids(buf.sample(4)) for _ in range(5)] for buf in (a, b, c)]
    assert draws[0] == draws[1] == draws[2]
    assert a.stats() == b.stats() == c.stats()
    assert a.stats()["reserve_size"] == 0 and a.stats()["evicted"] == 5


def test_without_replacement_short_buffer_returns_all_shuffled() -> None:
    buf = make_buffer("replay", 100, seed=0)
    buf.push([mk(i) for i in range(50)])
    orders = {tuple(ids(buf.sample(256))) for _ in range(5)}
    assert all(sorted(o) == list(range(50)) for o in orders)
    assert len(orders) > 1  # random order
    assert all(r.times_sampled == 5 for r in buf.items())


def test_with_replacement_returns_n_and_counts_each_draw() -> None:
    buf = make_buffer("replay", 3, with_replacement=True, seed=0)
    assert buf.sample(4) == []
    buf.push([mk(i) for i in range(3)])
    batch = buf.sample(30)
    assert len(batch) == 30
    assert sum(r.times_sampled for r in buf.items()) == 30
    assert batch_stats(batch, 0)["distinct_frac"] == pytest.approx(3 / 30)


def test_staleness_prefix_and_out_of_order() -> None:
    buf = make_buffer("replay", 10, max_staleness=2)
    buf.push([mk(i, version=v) for i, v in enumerate([0, 1, 2, 3, 4])])
    assert len(buf.sample(10)) == 5  # no current_version: no filter
    assert sorted(ids(buf.sample(10, current_version=4))) == [2, 3, 4]  # oldest two dropped
    buf.push([mk(10, version=1), mk(11, version=5), mk(12, version=2)])  # out of order
    assert sorted(ids(buf.sample(10, current_version=5))) == [3, 4, 11]
    assert ids(buf.items()) == [3, 4, 11]
    assert buf.stats()["dropped_stale"] == 5 and buf.stats()["evicted"] == 0
    buf.push([mk(13, version=6)])
    assert ids(buf.items()) == [3, 4, 11, 13]  # ring still consistent after compaction

    q = make_buffer("onpolicy", None, max_staleness=0)
    q.push([mk(0, version=1), mk(1, version=0), mk(2, version=1)])
    assert ids(q.sample(5, current_version=1)) == [2, 0]
    assert q.stats()["dropped_stale"] == 1


def test_positive_bias_after_compaction_and_wraparound() -> None:
    buf = make_buffer("replay", 6, sampler="positive_bias", delta=0.5, max_staleness=1)
    model = FifoModel(6, 0.5)
    rng = np.random.default_rng(0)
    for i in range(60):
        r = mk(i, bool(rng.integers(2)), int(i // 4 - rng.integers(3)))  # versions shuffled
        buf.push([r])
        model.push([r])
        if i % 5 == 4:
            model.drop_stale(i // 4, 1)
            assert ids(buf.candidates(i // 4)) == ids(model.items())
            assert ids(buf.reserve_items()) == ids(model.reserve)
    assert buf.stats()["evicted"] == model.evicted


def test_state_dict_legacy_single_fifo() -> None:
    """A state saved before the reserve existed (one FIFO of N, no reserve_size) loads."""
    old = make_buffer("replay", 8, sampler="positive_bias", delta=0.25, seed=0)
    old.push([mk(i, i in {0, 1, 3, 6, 9}) for i in range(10)])
    state = old.state_dict()
    state.pop("reserve_size")
    state["order"] = list(range(len(state["rollouts"])))
    state["rollouts"] = [rollout_to_dict(mk(i, i in {0, 2, 3, 6, 9})) for i in range(2, 10)]
    new = make_buffer("replay", 8, sampler="positive_bias", delta=0.25, seed=0)
    new.load_state_dict(state)  # 2..9 stored: window {4..9}; correct older: {2, 3}
    assert (ids(new.reserve_items()), ids(new.fresh_items())) == ([2, 3], [4, 5, 6, 7, 8, 9])
    bad = old.state_dict()
    bad["reserve_size"] = 3
    with pytest.raises(ValueError, match="reserve_size=3"):
        new.load_state_dict(bad)


def test_sharded_routing_and_union_sampling() -> None:
    buf = make_buffer("replay", 9, num_shards=3, seed=0)
    assert isinstance(buf, ShardedBuffer) and buf.num_shards == 3
    buf.push([mk(i) for i in range(7)])
    assert [ids(buf.shard(i).items()) for i in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(ids(buf.sample(20))) == list(range(7))
    assert set(ids(buf.sample(5, shard=1))) == {1, 4}
    assert buf.stats()["capacity"] == 9 and buf.stats()["size"] == 7
    with pytest.raises(ValueError, match="shard=3"):
        buf.shard(3)
    many = make_buffer("replay", 300, num_shards=3, seed=0)
    many.push([mk(i) for i in range(300)])
    counts = Counter(r.step % 3 for _ in range(30) for r in many.sample(30))
    assert all(200 < c < 400 for c in counts.values())  # ~uniform over the union


def test_make_buffer_kinds_and_protocol() -> None:
    for buf in (
        make_buffer("replay", 4),
        make_buffer("onpolicy", None),
        make_buffer("replay", 4, num_shards=2),
    ):
        assert isinstance(buf, Buffer)
        assert set(buf.stats()) >= {
            "size",
            "capacity",
            "pushed",
            "evicted",
            "consumed",
            "dropped_stale",
        }


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("lifo", 4), {}, "kind='lifo'"),
        (("replay", 0), {}, "capacity=0"),
        (("replay", None), {}, "capacity=None"),
        (("replay", 4.0), {}, "capacity=4.0"),
        (("replay", 4), {"delta": 1.0, "sampler": "positive_bias"}, "delta=1.0"),
        (("replay", 4), {"delta": -0.1, "sampler": "positive_bias"}, "delta=-0.1"),
        (("replay", 4), {"delta": 0.2}, "delta=0.2"),
        (("replay", 4), {"sampler": "prioritized"}, "sampler='prioritized'"),
        (("replay", 10), {"num_shards": 3}, "num_shards=3"),
        (("replay", 10), {"num_shards": 0}, "num_shards=0"),
        (("replay", 4), {"max_staleness": -1}, "max_staleness=-1"),
        (("replay", 4), {"seed": -1}, "seed=-1"),
        (("onpolicy", 4), {"with_replacement": True}, "with_replacement=True"),
        (("onpolicy", 4), {"sampler": "positive_bias", "delta": 0.2}, "sampler="),
    ],
)
def test_make_buffer_errors(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        make_buffer(*args, **kwargs)


def test_sample_rejects_negative_n() -> None:
    with pytest.raises(ValueError, match="n=-1"):
        make_buffer("replay", 4).sample(-1)
    with pytest.raises(ValueError, match="n=-1"):
        make_buffer("onpolicy", 4).sample(-1)


def test_draw_indices() -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    assert len(draw_indices(rng, 0, 5, True)) == 0
    d = draw_indices(rng, 10, 10, False)
    assert sorted(d.tolist()) == list(range(10))
    assert len(draw_indices(rng, 3, 7, True)) == 7


def test_batch_stats() -> None:
    a, b = mk(0, version=3), mk(1, version=5)
    a.times_sampled, b.times_sampled = 4, 1
    s = batch_stats([a, b, a], current_version=6)
    assert s == {
        "batch_size": 3.0,
        "age_mean": pytest.approx(7 / 3),
        "age_max": 3.0,
        "distinct_frac": pytest.approx(2 / 3),
        "times_sampled_mean": 3.0,
        "times_sampled_max": 4.0,
    }
    assert batch_stats([], 0)["batch_size"] == 0.0


def test_concurrent_producers_and_consumers() -> None:
    buf = make_buffer("replay", 50, num_shards=2, seed=0)
    q = make_buffer("onpolicy", None)
    got: list[int] = []
    lock = threading.Lock()

    def produce(base: int) -> None:
        for i in range(100):
            r = [mk(base + i)]
            buf.push(r)
            q.push([mk(base + i)])

    def consume() -> None:
        for _ in range(100):
            buf.sample(4)
            out = q.sample(3)
            with lock:
                got.extend(ids(out))

    threads = [threading.Thread(target=produce, args=(k * 1000,)) for k in range(3)]
    threads += [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got.extend(ids(q.sample(10_000)))
    assert sorted(got) == sorted(k * 1000 + i for k in range(3) for i in range(100))
    s = buf.stats()
    assert s["pushed"] == 300 and s["size"] == 50 and s["evicted"] == 250
