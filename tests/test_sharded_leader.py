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
