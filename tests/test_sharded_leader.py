"""Rank 0's side of a collective with sharded learners on Ray (`ShardedLeader._all_ranks`):
a follower that fails before it joins ends the run at once, naming its rank, instead of
leaving rank 0 waiting in the collective until the process group's timeout.

Ray's futures are played by a small in-test double with `ray.wait` / `ray.get`'s contract
(ready refs, errors raised by `get`); the real actors run in tests/test_ray_fsdp*.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from replayrl.errors import RunFailed
from replayrl.run.distributed import fsdp_learner
from replayrl.run.distributed.fsdp_learner import ShardedLeader


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


class Ref:
    """A follower's call: done once `ready` is set, with its value or error."""

    def __init__(self, error: Exception | None = None, ready: bool = True) -> None:
        self.error, self.ready = error, threading.Event()
        if ready:
            self.ready.set()


class FakeRay:
    exceptions = SimpleNamespace(RayError=RayError, RayActorError=RayActorError)

    def __init__(self) -> None:
        self.got: list[Ref] = []

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not any(r.ready.is_set() for r in refs):
            time.sleep(0.01)
        ready = [r for r in refs if r.ready.is_set()][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: Ref) -> None:
        assert ref.ready.is_set(), "get of a call that has not finished"
        self.got.append(ref)
        if ref.error is not None:
            raise ref.error


def _leader(refs: list[Ref], ray: FakeRay) -> tuple[ShardedLeader, list[str]]:
    learner = SimpleNamespace(device=torch.device("cpu"))
    calls: list[str] = []
    followers = [SimpleNamespace(name=f"rank {i + 1}") for i in range(len(refs))]
    by_name = {f.name: r for f, r in zip(followers, refs, strict=True)}
    leader = ShardedLeader(learner, followers, ray)  # type: ignore[arg-type]
    leader._call = lambda f: (calls.append(f.name), by_name[f.name])[1]  # type: ignore[attr-defined]
    return leader, calls


def _collective_waiting_for(event: threading.Event) -> Any:
    """Rank 0's part of a collective: it returns only when every rank has joined; a rank
    that never joins leaves it waiting until the group's timeout (here 20 s), then it fails
    with the collective's own, rank-less error."""

    def here() -> str:
        if not event.wait(timeout=20):
            raise RuntimeError("Connection closed by peer")  # what gloo says at its timeout
        return "gathered"

    return here


def test_a_follower_failing_before_the_collective_ends_it_naming_the_rank(monkeypatch) -> None:
    monkeypatch.setattr(fsdp_learner, "GATHER_TIMEOUT_S", 60.0)
    ray = FakeRay()
    joined = threading.Event()  # never set: rank 2 failed before joining
    refs = [Ref(ready=False), Ref(error=RayError("No space left on device"))]
    leader, calls = _leader(refs, ray)
    with pytest.raises(RunFailed, match=r"rank 2 failed in a checkpoint's write.*No space"):
        leader._all_ranks("a checkpoint's write", leader._call, _collective_waiting_for(joined))
    assert calls == ["rank 1", "rank 2"]  # every follower was asked before rank 0 waited
    joined.set()  # release the blocked part so the test leaves no thread waiting


def test_a_lost_follower_is_named_as_lost(monkeypatch) -> None:
    monkeypatch.setattr(fsdp_learner, "GATHER_TIMEOUT_S", 60.0)
    joined = threading.Event()
    refs = [Ref(error=RayActorError("the actor died"))]
    leader, _ = _leader(refs, FakeRay())
    with pytest.raises(RunFailed, match="rank 1 was lost in a gather of the model"):
        leader._all_ranks("a gather of the model", leader._call, _collective_waiting_for(joined))
    joined.set()


def test_when_every_rank_joins_rank_0_gets_its_result_and_every_follower_is_checked() -> None:
    ray = FakeRay()
    joined = threading.Event()
    refs = [Ref(ready=False), Ref(ready=False)]

    def followers_finish() -> None:
        time.sleep(0.2)
        joined.set()
        for r in refs:
            r.ready.set()

    threading.Thread(target=followers_finish, daemon=True).start()
    leader, _ = _leader(refs, ray)
    assert leader._all_ranks("a gather", leader._call, _collective_waiting_for(joined)) == (
        "gathered"
    )
    assert set(map(id, ray.got)) == set(map(id, refs))


def test_rank_0s_own_error_is_raised_as_is() -> None:
    leader, _ = _leader([Ref()], FakeRay())

    def here() -> None:
        raise ValueError("disk full on rank 0")

    with pytest.raises(ValueError, match="disk full on rank 0"):
        leader._all_ranks("a checkpoint's write", leader._call, here)


def test_rank_0s_error_ends_it_while_a_follower_still_waits_in_the_collective(
    monkeypatch,
) -> None:
    # the follower waits for rank 0, which failed: its call would end only at the timeout
    monkeypatch.setattr(fsdp_learner, "GATHER_TIMEOUT_S", 60.0)
    waiting = Ref(ready=False)
    leader, _ = _leader([waiting], FakeRay())

    def here() -> None:
        raise ValueError("rank 0's own write failed")

    with pytest.raises(ValueError, match="rank 0's own write failed"):
        leader._all_ranks("a checkpoint's write", leader._call, here)
    waiting.ready.set()


def test_a_follower_that_never_answers_times_out_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(fsdp_learner, "GATHER_TIMEOUT_S", 0.3)
    leader, _ = _leader([Ref(), Ref(ready=False)], FakeRay())
    with pytest.raises(RunFailed, match=r"rank\(s\) \[2\] did not finish a gather"):
        leader._all_ranks("a gather", leader._call, lambda: "gathered")


def test_sharded_learners_send_weights_in_the_dtype_their_own_policy_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A weight sync from sharded learners gathers the policy in the generation dtype chosen
    on the learners' own policy (precision.generation), and the pool sends it in that dtype,
    whatever the gathered host copy would choose."""
    from replayrl.config.schema import load_config

    cfg = load_config(None, ["precision.generation=bfloat16"])
    policy = torch.nn.Linear(2, 2)
    learner = SimpleNamespace(model=policy, cfg=cfg, device=torch.device("cpu"))
    leader = ShardedLeader(learner, [], FakeRay())  # type: ignore[arg-type]
    assert leader.sync_dtype() == torch.bfloat16
    learner.cfg = load_config(None, ["precision.generation=float32"])
    assert leader.sync_dtype() == torch.float32
    learner.cfg = cfg
    gathered: list[Any] = []
    monkeypatch.setattr(leader, "sync_model", lambda dtype=None: gathered.append(dtype) or policy)
    sent: list[tuple[Any, int, Any]] = []
    pool = SimpleNamespace(
        publish=lambda model, version, dtype=None: sent.append((model, version, dtype))
    )
    fsdp_learner.FullWeightsPool(pool, leader).publish(policy, 7)
    assert gathered == [torch.bfloat16] and sent == [(policy, 7, torch.bfloat16)]


class _Lost(Exception):
    pass


class _Actor:
    """A generator actor double: `evaluate.remote` runs at once (a `Ref` with the result or
    the error), recording the weights and version it was given."""

    def __init__(self, name: str, lost: bool = False) -> None:
        self.name, self.lost, self.calls = name, lost, []
        self.evaluate = SimpleNamespace(remote=self._evaluate)

    def _evaluate(self, rows: list, weights: Any, version: int) -> Any:
        self.calls.append((weights, version))
        if self.lost:
            return SimpleNamespace(error=_Lost(f"{self.name} is gone"))
        return SimpleNamespace(value={"eval/accuracy": 0.5, "policy_version": version})


def _pool(tmp_path: Any, actors: list[_Actor]) -> Any:
    from replayrl.run.distributed import ray_runtime
    from tiny import tiny_config

    def get(ref: Any, timeout: float | None = None) -> Any:
        if getattr(ref, "error", None) is not None:
            raise ref.error
        return ref.value

    pool = ray_runtime.RayGeneratorPool.__new__(ray_runtime.RayGeneratorPool)
    pool.cfg = tiny_config(tmp_path, "workers.generators=2", "workers.max_restarts=1")
    pool.log = lambda msg: None
    pool.ray = SimpleNamespace(
        get=get,
        put=lambda state: ("put", sorted(state)),
        kill=lambda actor: None,
        exceptions=SimpleNamespace(RayActorError=_Lost, GetTimeoutError=TimeoutError),
    )
    pool.actors, pool.incarnations, pool.restart_counts = list(actors), [0, 0], [0, 0]
    pool.synced, pool.pending, pool.lost, pool.evaluations = [-1, -1], {}, 0, 0
    pool.sync_path, pool.weights, pool.version = "object_store", "published-ref", 3
    pool.sender = SimpleNamespace(forget=lambda i: None)
    return pool


def test_generator_0_evaluates_the_published_weights_or_newer_ones_sent_to_it_alone(
    tmp_path: Any,
) -> None:
    """On the sync grid generator 0 evaluates the published weights; off it, the learner's
    newer weights go to generator 0 alone and it is re-synced before its next batch; a
    generator 0 lost on the way is replaced (counted as a restart) and the evaluation runs on
    the replacement."""
    first, other = _Actor("g0"), _Actor("g1")
    pool = _pool(tmp_path, [first, other])
    assert pool.evaluate([{"prompt": "1+1="}]) == {"eval/accuracy": 0.5, "policy_version": 3}
    assert first.calls == [("published-ref", 3)] and pool.synced[0] == 3
    assert pool.evaluate([], torch.nn.Linear(2, 2), 4)["policy_version"] == 4
    assert first.calls[-1] == (("put", ["bias", "weight"]), 4)
    assert pool.synced == [-1, -1] and pool.version == 3  # the others keep their schedule
    assert other.calls == []

    lost, spare = _Actor("g0", lost=True), _Actor("g0 again")
    pool = _pool(tmp_path, [lost, other])
    pool._new_actor = lambda worker_id, incarnation: spare
    pool.pending = {"batch in flight": 0}
    assert pool.evaluate([])["policy_version"] == 3
    assert pool.actors[0] is spare and spare.calls == [("published-ref", 3)]
    assert pool.restart_counts[0] == 1 and pool.pending == {}
    assert pool.lost == pool.cfg.rollouts_per_step  # the lost actor's batch in flight
    pool.actors[0].lost = True  # lost again, with no restart left: workers.max_restarts
    with pytest.raises(RunFailed, match="died after 1 restarts"):
        pool.evaluate([])
    pool = _pool(tmp_path, [_Actor("g0", lost=True), other])
    pool._new_actor = lambda worker_id, incarnation: _Actor("g0 again", lost=True)
    with pytest.raises(RunFailed, match="lost twice in an evaluation"):  # not a third try
        pool.evaluate([])
