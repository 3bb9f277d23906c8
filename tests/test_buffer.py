"""Tests for replayrl.buffer: model-based property tests plus worked examples."""

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

from replayrl.buffer import (
    Buffer,
    OnPolicyQueue,
    ReplayBuffer,
    ShardedBuffer,
    batch_stats,
    draw_indices,
    make_buffer,
    positive_bias,
    uniform,
)
from replayrl.buffer.samplers import num_reserved
from replayrl.rollout import Rollout

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


def model_candidates(items: list[Rollout], capacity: int, delta: float) -> list[Rollout]:
    """Reference rule, written independently: freshest N-k plus freshest k correct older."""
    k = math.floor(delta * capacity + 1e-9)
    n_fresh = capacity - k
    if len(items) <= n_fresh:
        return list(items)
    older, fresh = items[: len(items) - n_fresh], items[len(items) - n_fresh :]
    extras = [r for r in older if r.correct]
    extras = extras[max(0, len(extras) - k) :] if k else []
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
    delta=st.sampled_from([0.0, 0.2, 0.5, 0.75]),
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
    model: list[Rollout] = []
    pusher = Pusher()
    evicted = dropped = consumed = 0
    uses: Counter[int] = Counter()
    for op in ops:
        if op[0] == "push":
            new = pusher.make(op[1])
            buf.push(new)
            model.extend(new)
            while len(model) > capacity:  # FIFO: the oldest go first
                model.pop(0)
                evicted += 1
        else:
            _, n, cv = op
            kept = drop_stale(model, cv, max_staleness)
            dropped += len(model) - len(kept)
            model = kept
            cands = model_candidates(model, capacity, delta)
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
        assert ids(buf.items()) == ids(model)  # sampling never removes; FIFO order
    for r in buf.items():
        assert r.times_sampled == uses[r.step]
    s = buf.stats()
    assert (s["size"], s["capacity"], s["pushed"]) == (len(model), capacity, pusher.next)
    assert (s["evicted"], s["dropped_stale"], s["consumed"]) == (evicted, dropped, consumed)


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
    extra = {"sampler": "positive_bias", "delta": 0.5} if kind == "positive_bias" else {}
    real_kind = "onpolicy" if kind == "onpolicy" else "replay"
    buf = make_buffer(real_kind, capacity, num_shards=num_shards, seed=7, **extra)
    shards = buf.shards if isinstance(buf, ShardedBuffer) else [buf]
    assert len(shards) == num_shards
    models: list[list[Rollout]] = [[] for _ in range(num_shards)]
    pusher = Pusher()
    for op, choice in zip(ops, shard_choice, strict=False):
        if op[0] == "push":
            new = pusher.make(op[1])
            buf.push(new)
            for r in new:  # round-robin routing: push p goes to shard p % T
                m = models[r.step % num_shards]
                m.append(r)
                if len(m) > per_shard:
                    m.pop(0)
        else:
            n = op[1]
            present = {r.step for m in models for r in m}
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
                gone = set(ids(batch))
                models = [[r for r in m if r.step not in gone] for m in models]
            elif kind == "replay" and (choice is None or not isinstance(buf, ShardedBuffer)):
                assert len(batch) == min(n, len(present))
                assert len(set(ids(batch))) == len(batch)
        for i, s in enumerate(shards):
            assert len(s) <= per_shard
            assert ids(s.items()) == ids(models[i])  # FIFO per shard
        # every stored item is in exactly one shard, the one its push index names
        stored = [r.step for s in shards for r in s.items()]
        assert len(stored) == len(set(stored))
    assert buf.stats()["pushed"] == pusher.next
    assert sum(s.stats()["pushed"] for s in shards) == pusher.next


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
    # N = 8, delta = 0.5: k = 4 reserved slots, fresh window = freshest 4.
    buf = make_buffer("replay", 8, sampler="positive_bias", delta=0.5, seed=0)
    correct = {0, 2, 3, 6}
    buf.push([mk(i, i in correct) for i in range(6)])
    # not full (6 <= 8): the same rule with N = 8 -> fresh {2,3,4,5}, older {0,1}: 0 correct
    assert ids(buf.candidates()) == [0, 2, 3, 4, 5]
    buf.push([mk(i, i in correct) for i in (6, 7)])
    assert ids(buf.candidates()) == [0, 2, 3, 4, 5, 6, 7]  # older {0..3}: 0, 2, 3 correct
    buf.push([mk(8)])  # evicts 0; fresh {5..8}, older {1..4}: 2, 3 correct
    assert ids(buf.candidates()) == [2, 3, 5, 6, 7, 8]
    assert sorted(ids(buf.sample(100))) == [2, 3, 5, 6, 7, 8]
    for _ in range(20):
        assert set(ids(buf.sample(3))) <= {2, 3, 5, 6, 7, 8}  # 1 and 4 never
    assert buf.stats()["candidates"] == 6


def test_positive_bias_sampler_function() -> None:
    sampler = positive_bias(0.5)
    correct_offsets = [0, 2, 3]  # offsets of correct items, oldest first

    def before(o: int) -> int:
        return sum(1 for c in correct_offsets if c < o)

    cs = sampler(8, 8, before)
    assert (cs.fresh_start, cs.n_extra, len(cs)) == (4, 3, 7)
    cs = sampler(3, 8, before)  # not full: window covers everything
    assert (cs.fresh_start, cs.n_extra, len(cs)) == (0, 0, 3)
    assert uniform(5, 8).fresh_start == 0 and len(uniform(5, 8)) == 5
    assert num_reserved(0.29, 100) == 29 and num_reserved(0.2, 84) == 16
    with pytest.raises(ValueError, match="delta"):
        positive_bias(1.0)


def test_delta_zero_equals_uniform() -> None:
    a = make_buffer("replay", 10, seed=5)
    b = make_buffer("replay", 10, sampler="positive_bias", delta=0.0, seed=5)
    for buf in (a, b):
        buf.push([mk(i, i % 2 == 0) for i in range(15)])
    assert [ids(a.sample(4)) for _ in range(5)] == [ids(b.sample(4)) for _ in range(5)]


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
    model: list[Rollout] = []
    rng = np.random.default_rng(0)
    for i in range(60):
        r = mk(i, bool(rng.integers(2)), int(i // 4 - rng.integers(3)))
        buf.push([r])
        model = (model + [r])[-6:]
        if i % 5 == 4:
            model = drop_stale(model, i // 4, 1)
            assert ids(buf.candidates(i // 4)) == ids(model_candidates(model, 6, 0.5))
            assert ids(buf.items()) == ids(model)


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
