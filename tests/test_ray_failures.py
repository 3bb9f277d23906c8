"""runtime=ray failures on a three-node Ray cluster (`ray.cluster_utils.Cluster`, all nodes on
this machine): the head (A) only holds the driver, node B (`generator_node`) the generators,
node C (`learner_node`) the learner and its buffer shard, so losing node C loses the learner
but not the driver. A lost learner node or a killed buffer actor fails the run (non-zero exit,
the newest complete checkpoint named); `--resume`, on the same or a fresh cluster, continues
from that checkpoint with the buffer as it was checkpointed.

The audit hook of tests/test_ray_cluster.py runs in every worker process (weights published,
files written), plus a record of each buffer restore (its size and a digest of its contents).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import test_ray_cluster
from replayrl.cli.main import main
from replayrl.config.schema import load_config
from replayrl.errors import RunFailed
from replayrl.run.start import resume, train
from replayrl.storage.checkpoint import find_checkpoints, load_state
from test_ray_cluster import CLUSTER, _audit, _record, _run, _wait_for, _worker_hook

pytestmark = pytest.mark.ray

STEPS, EVERY = 12, 2  # long enough to be mid-run at the first checkpoint


def _canon(x: Any) -> Any:
    """Plain JSON-able data with tensors and arrays as lists (a checkpoint's buffer state
    and a live buffer's `state_dict` compare equal when their contents do)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", str(x.dtype), x.tolist()]
    if isinstance(x, np.ndarray | np.generic):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    return x


def _state_digest(state: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(_canon(state), sort_keys=True).encode()).hexdigest()[:16]


def _hook() -> None:
    """The cluster test's audit, plus a record of each replay buffer restored from a
    checkpoint (patched on the buffer class, not the actor class: Ray pickles actor classes)."""
    from replayrl.data.buffer.replay import ReplayBuffer

    _worker_hook()
    load = ReplayBuffer.load_state_dict

    def load_(self: ReplayBuffer, state: dict[str, Any]) -> None:
        load(self, state)
        _record("buffer_restored", size=len(self), digest=_state_digest(self.state_dict()))

    ReplayBuffer.load_state_dict = load_  # type: ignore[method-assign]


def _start(cl: dict[str, Any]) -> None:
    """A fresh cluster (and a fresh `ray.init`): head A, generator node B, learner node C."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cl["b"] = c.add_node(num_cpus=1, resources={"generator_node": 2})
    cl["c"] = c.add_node(num_cpus=1, resources={"learner_node": 4})
    for module in (
        test_ray_cluster,
        sys.modules[__name__],
    ):  # workers cannot import the tests folder
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(
        address=c.address,
        runtime_env={"worker_process_setup_hook": _hook},
        logging_level="WARNING",
    )
    c.wait_for_nodes()
    cl.update(cluster=c, head=c.head_node.node_id)


def _stop(cl: dict[str, Any]) -> None:
    import ray

    ray.shutdown()
    cl["cluster"].shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    audit = tmp_path_factory.mktemp("audit")
    os.environ["REPLAYRL_AUDIT_DIR"] = str(audit)  # the nodes' worker processes inherit it
    cl: dict[str, Any] = {"audit": audit}
    _start(cl)
    try:
        yield cl
    finally:
        _stop(cl)
        os.environ.pop("REPLAYRL_AUDIT_DIR", None)


def _fail_mid_run(run_fn: Callable[[], Any], run: Path, kill: Callable[[], None]) -> dict:
    """`run_fn` in a thread; once `run` has a complete checkpoint, `kill()`. Returns
    {"result"} or {"error"}, and "ckpt": the newest complete checkpoint at the kill."""
    out: dict[str, Any] = {}

    def target() -> None:  # a thread: the test waits and kills meanwhile
        try:
            out["result"] = run_fn()
        except BaseException as exc:  # the test asserts on it
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    _wait_for(lambda: find_checkpoints(run)[0] is not None or not t.is_alive(), 300)
    assert t.is_alive(), out  # killed mid-run, not after it ended
    out["ckpt_at_loss"] = find_checkpoints(run)[0]
    kill()
    t.join(timeout=120)  # no hang: the run must end soon after the loss
    assert not t.is_alive(), "the run did not end after the loss"
    out["ckpt"] = find_checkpoints(run)[0]
    return out


def _published(cl: dict, version: int, after: float, before: float = float("inf")) -> set:
    """Digests of the weights the learner published at `version` within (after, before)."""
    return {
        e["digest"]
        for e in _audit(cl["audit"])
        if e["kind"] == "published" and e["version"] == version and after < e["t"] < before
    }


def _overrides(run_dir: Path) -> list[str]:
    return [
        *CLUSTER,
        f"logging.run_dir={run_dir}",
        f"train.steps={STEPS}",
        f"checkpoint.every={EVERY}",
        "checkpoint.keep_last=10",
    ]


def test_lost_learner_node_fails_naming_the_checkpoint_and_resumes_on_a_fresh_cluster(
    cluster: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = (tmp_path / "demo").resolve()
    t0 = time.time()
    try:
        out = _fail_mid_run(
            lambda: main(["train", *_overrides(tmp_path)]),
            run,
            lambda: cluster["cluster"].remove_node(cluster["c"]),
        )
        killed = time.time()
    finally:  # a fresh cluster, node C included, whatever happened (the next tests need it)
        _stop(cluster)
        _start(cluster)  # nothing of the old one (actors, object store) to lean on
    err = capsys.readouterr().err
    # the CLI exits non-zero, naming the newest complete checkpoint and the resume command
    assert out.get("result") == 2, out
    ckpt = out["ckpt"]
    assert "the learner actor (and the buffer shards" in err and "died mid-run" in err, err
    assert f"last good checkpoint: {ckpt}" in err and f"replayrl train --resume {run}" in err
    state = load_state(ckpt)
    k, version = state["counters"]["step"], state["learner"]["version"]
    assert EVERY <= k < STEPS

    resumed_at = time.time()
    assert main(["train", "--resume", str(run)]) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS
    led = summary["accounting"]["ledger"]
    assert led["balanced"], led
    # steps counted from the checkpoint: the resumed run logged steps k+1..STEPS once
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]
    assert [s for s in steps if s > k] == list(range(k + 1, STEPS + 1)), steps
    # it started from the checkpoint's weights: its first publish (at the checkpoint's
    # version) is the weights the lost learner published when it wrote that checkpoint
    before = _published(cluster, version, t0, killed)
    assert before and _published(cluster, version, resumed_at) == before
    # counters carried over: the ledger counts the failed run's rollouts too
    assert led["generated"] >= state["counters"]["rollouts_generated"] > 0


def test_killed_buffer_actor_fails_the_run_and_resume_restores_the_buffer(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from replayrl.run.distributed.ray_runtime import RayDriver

    run = (tmp_path / "demo").resolve()
    wait = RayDriver._wait
    learner: list[Any] = []

    def wait_(self: RayDriver, ray_: Any, actor: Any, ref: Any) -> dict[str, Any]:
        learner.append(actor)  # the learner actor's handle, to reach its buffer actor
        return wait(self, ray_, actor, ref)

    monkeypatch.setattr(RayDriver, "_wait", wait_)

    def kill_buffer() -> None:
        (handle,) = ray.get(learner[0].buffers.remote(), timeout=60)
        ray.kill(handle)

    log: list[str] = []
    cfg = load_config(None, _overrides(tmp_path))
    out = _fail_mid_run(lambda: train(cfg, log=log.append), run, kill_buffer)
    exc, ckpt = out.get("error"), out["ckpt"]
    assert isinstance(exc, RunFailed), out
    msg = str(exc)
    assert "the buffer actor died mid-run" in msg and "Traceback" not in msg, msg
    assert f"last good checkpoint: {ckpt}" in msg and "--resume" in msg, msg
    # nothing was silently emptied: no checkpoint was written after the loss
    assert ckpt == out["ckpt_at_loss"]
    buffer = load_state(ckpt)["buffer"]
    size = len(buffer["order"])  # stored slots
    assert size > 0

    resumed_at = time.time()
    summary = resume(run, log=log.append)
    assert summary["steps"] == STEPS and summary["accounting"]["ledger"]["balanced"]
    restored = [e for e in _audit(cluster["audit"]) if e["kind"] == "buffer_restored"]
    restored = [e for e in restored if e["t"] > resumed_at]
    # the resumed buffer holds exactly the checkpoint's rollouts (counters and RNG too)
    assert [(e["size"], e["digest"]) for e in restored] == [(size, _state_digest(buffer))]


def test_half_run_plus_resume_matches_a_whole_run_where_it_is_exact(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    S = 4
    whole = _run(cluster, tmp_path / "whole", f"train.steps={S}", monkeypatch=monkeypatch)
    _run(cluster, tmp_path / "half", f"train.steps={S // 2}", monkeypatch=monkeypatch)
    half = tmp_path / "half" / "demo"
    state = load_state(find_checkpoints(half)[0])
    assert state["counters"]["step"] == S // 2
    resumed = resume(half, [f"train.steps={S}"], log=lambda _: None)
    assert whole["steps"] == resumed["steps"] == S
    a, b = whole["accounting"]["ledger"], resumed["accounting"]["ledger"]
    assert a["balanced"] and b["balanced"], (a, b)
    # exact: the checkpointed step and version, and what the learner drew (S batches of B
    # in both runs, the half run's share carried over in the checkpoint's counters, as are
    # its generated rollouts in the resumed ledger)
    assert whole["policy_version"] == resumed["policy_version"] == S
    assert b["generated"] >= state["counters"]["rollouts_generated"] > 0
    for summary in (whole, resumed):
        sampled = summary["accounting"]["roles"]["learner/0"]["rollouts"]
        assert sampled == S * 8, summary["accounting"]["roles"]  # B = 8, one epoch
    # Not exact, hence not compared: how many rollouts the generators made, which weights
    # version made each, and so the trained weights. The generators run concurrently with
    # the learner and the order in which deliveries reach the buffer depends on process
    # timing, in the uninterrupted run as in the resumed one.


def test_buffer_calls_are_bounded_and_a_dead_buffer_is_a_run_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No Ray needed: a stand-in `ray` whose get times out, then reports the actor dead."""
    from types import SimpleNamespace

    import ray

    from replayrl.run.distributed import ray_runtime

    asked: list[float | None] = []
    raised: list[Exception] = [
        ray.exceptions.GetTimeoutError("late"),
        ray.exceptions.ActorDiedError(),
    ]

    def get(ref: Any, timeout: float | None = None) -> Any:
        asked.append(timeout)
        raise raised.pop(0)

    fake = SimpleNamespace(get=get, exceptions=ray.exceptions)
    monkeypatch.setattr(ray_runtime, "_ray", lambda: fake)
    call = SimpleNamespace(remote=lambda *a: "ref")
    buf = ray_runtime.RemoteBuffer(SimpleNamespace(call=call), "replay")
    with pytest.raises(RunFailed, match="the buffer actor did not answer within 600 s"):
        buf.sample(8, 3)
    with pytest.raises(RunFailed, match="the buffer actor died mid-run .ActorDiedError.: not"):
        buf.push([object()])
    assert asked == [ray_runtime._CALL_TIMEOUT_S] * 2  # never an unbounded wait
