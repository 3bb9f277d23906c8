"""runtime=ray on a two-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on this
machine): node A (the head) holds the custom resource `learner_node`, node B `generator_node`;
`ray.*_resources` pin the learner and buffer shards to A and the generators to B.

Every Ray worker process of the run gets an audit hook (`worker_process_setup_hook`) that
logs, with its node id, each file it writes and each weight sync a generator receives or the
learner publishes; the driver is audited in-process. Tests then assert where things ran.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from replayrl.config.schema import load_config
from replayrl.run.start import train
from tiny import TINY_RUN

pytestmark = pytest.mark.ray

CLUSTER = [
    *TINY_RUN,
    "runtime=ray",
    "method.name=replay",
    "buffer.capacity=32",
    "train.batch_size=8",
    "train.threads=1",
    "workers.max_staleness=3",
    "ray.generator_num_cpus=0.25",
    "ray.learner_num_cpus=0.25",
    "ray.generator_resources={generator_node: 1}",
    "ray.learner_resources={learner_node: 1}",
    "ray.buffer_resources={learner_node: 1}",
]


# -- the audit, run in every worker process (pickled by value: workers cannot import tests) --
def _digest(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _record(kind: str, **fields: Any) -> None:
    import ray

    out = Path(os.environ["REPLAYRL_AUDIT_DIR"]) / f"{os.getpid()}.jsonl"
    node = ray.get_runtime_context().get_node_id()
    line = {"kind": kind, "pid": os.getpid(), "node": node, "t": time.time()}
    with _OPEN(out, "a") as f:  # the unpatched open: not itself audited
        f.write(json.dumps({**line, **fields}) + "\n")


_OPEN = builtins.open


def _audit_writes() -> None:
    """Wrap open and io.open (pathlib's; write modes), os.replace and os.rename to log the
    target path."""
    real_open, real_replace, real_rename = builtins.open, os.replace, os.rename

    def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if isinstance(file, (str, Path)) and any(c in mode for c in "wax+"):
            _record("write", path=os.path.abspath(file))
        return real_open(file, mode, *a, **k)

    def replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        _record("write", path=os.path.abspath(dst))
        real_replace(src, dst, *a, **k)

    def rename(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        _record("write", path=os.path.abspath(dst))
        real_rename(src, dst, *a, **k)

    builtins.open = io.open = open_  # type: ignore[assignment]
    os.replace, os.rename = replace, rename  # type: ignore[assignment]


def _worker_hook() -> None:
    from replayrl.run.distributed import ray_runtime, worker

    _audit_writes()
    set_weights, publish = worker.GeneratorWorker.set_weights, ray_runtime.RayGeneratorPool.publish

    def set_weights_(self: Any, state: dict, version: int) -> None:
        _record("received", version=version, digest=_digest(state))
        set_weights(self, state, version)

    def publish_(self: Any, model: Any, version: int, *rest: Any) -> None:
        from replayrl.run.distributed.weights import trainable_state

        _record("published", version=version, digest=_digest(trainable_state(model)))
        publish(self, model, version, *rest)

    produce = worker.GeneratorWorker.produce

    def produce_(self: Any, idle_s: float) -> Any:
        # while the test holds (a file in the audit folder), a generator with trained weights
        # stops inside its batch: the node loss then surely falls on rollouts in flight
        hold = Path(os.environ["REPLAYRL_AUDIT_DIR"]) / "hold"
        if self.version >= 1 and hold.exists():
            _record("holding", version=self.version)
            deadline = time.monotonic() + 120
            while hold.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        return produce(self, idle_s)

    worker.GeneratorWorker.set_weights = set_weights_  # type: ignore[method-assign]
    worker.GeneratorWorker.produce = produce_  # type: ignore[method-assign]
    ray_runtime.RayGeneratorPool.publish = publish_  # type: ignore[method-assign]


def _audit(audit_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in audit_dir.glob("*.jsonl") for line in p.open()]


# -- the cluster, shared by the module's tests --------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    import ray
    from ray.cluster_utils import Cluster

    audit = tmp_path_factory.mktemp("audit")
    os.environ["REPLAYRL_AUDIT_DIR"] = str(audit)  # the nodes' worker processes inherit it
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"learner_node": 4}},
    )
    node_b = c.add_node(num_cpus=1, resources={"generator_node": 2})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address=c.address,
        runtime_env={"worker_process_setup_hook": _worker_hook},
        logging_level="WARNING",
    )
    c.wait_for_nodes()
    try:
        yield {"cluster": c, "audit": audit, "head": c.head_node.node_id, "b": node_b}
    finally:
        ray.shutdown()
        c.shutdown()
        os.environ.pop("REPLAYRL_AUDIT_DIR", None)


def _run(cl: dict, run_dir: Path, *extra: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    import ray

    driver_node = ray.get_runtime_context().get_node_id()
    assert driver_node == cl["head"]  # the driver joined the cluster through node A
    with monkeypatch.context() as m:  # the driver's own writes, audited the same way
        m.setattr(builtins, "open", builtins.open)
        m.setattr(io, "open", io.open)
        m.setattr(os, "replace", os.replace)
        m.setattr(os, "rename", os.rename)
        _audit_writes()
        cfg = load_config(None, [*CLUSTER, f"logging.run_dir={run_dir}", *extra])
        return train(cfg, log=cl.setdefault("log", []).append)


def _writers(cl: dict, run: Path) -> dict[str, set[str]]:
    """path written under `run` -> node ids of the processes that wrote it."""
    out: dict[str, set[str]] = {}
    for e in _audit(cl["audit"]):
        if e["kind"] == "write" and Path(e["path"]).is_relative_to(run):
            out.setdefault(e["path"], set()).add(e["node"])
    return out


def test_run_folder_is_written_on_the_learners_node_and_weights_reach_node_b(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = _run(cluster, tmp_path, "train.steps=3", monkeypatch=monkeypatch)
    assert summary["steps"] == 3 and summary["accounting"]["ledger"]["balanced"]
    run = (tmp_path / "demo").resolve()
    writers = _writers(cluster, run)
    # nothing under the run folder was written by a process of node B
    assert {n for nodes in writers.values() for n in nodes} == {cluster["head"]}
    # ...and every file in it was written (itself, or a folder renamed into place) on node A
    files = [p for p in run.rglob("*") if p.is_file()]
    names = {p.relative_to(run).parts[0] for p in files}
    assert {"metrics.jsonl", "summary.json", "completions.jsonl", "checkpoints"} <= names, names
    for p in files:
        assert any(str(q) in writers for q in (p, *p.parents) if q.is_relative_to(run)), p
    # checkpoints (they hold the ledger's counters) were written, all on node A
    assert any(Path(w).is_relative_to(run / "checkpoints") for w in writers), writers

    audit = _audit(cluster["audit"])
    published = {e["version"]: e["digest"] for e in audit if e["kind"] == "published"}
    received = [e for e in audit if e["kind"] == "received"]
    assert {e["node"] for e in audit if e["kind"] == "published"} == {cluster["head"]}
    assert received and {e["node"] for e in received} == {cluster["b"].node_id}
    # each sync a generator on node B got is the learner's weights of that version
    for e in received:
        assert published[e["version"]] == e["digest"], e
    assert max(e["version"] for e in received) >= 1  # synced after training, not only v0


def _wait_for(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _lose_node_b_mid_run(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[dict[str, Any], float]:
    """Train 6 steps; once node B's generator, holding weights trained at least once, is
    inside a batch (held there by the audit hook), remove node B, and 2 s later add a
    replacement generator node. Returns the run's outcome ({"summary"} or {"error"}) and
    when node B was removed."""
    c, audit = cluster["cluster"], cluster["audit"]
    start, out = time.time(), {}
    cluster["log"] = []
    hold = audit / "hold"
    hold.touch()

    def run() -> None:  # in a thread: Cluster.add_node installs signal handlers (main only)
        try:
            out["summary"] = _run(
                cluster, tmp_path, "train.steps=6", *extra, monkeypatch=monkeypatch
            )
        except BaseException as exc:  # the test asserts on it
            out["error"] = exc

    trainer = threading.Thread(target=run, daemon=True)
    trainer.start()
    try:
        _wait_for(
            lambda: (
                any(
                    e["kind"] == "holding" and e["version"] >= 1
                    for e in _audit(audit)
                    if e["t"] > start
                )
                or not trainer.is_alive()
            ),
            timeout=300,
        )
        assert trainer.is_alive(), out
        c.remove_node(cluster["b"])
        removed = time.time()
    finally:
        hold.unlink(missing_ok=True)  # the replacement generator runs freely
    time.sleep(2)  # the run goes on without a generator node for a while
    cluster["b"] = c.add_node(num_cpus=1, resources={"generator_node": 2})
    trainer.join(timeout=300)
    assert not trainer.is_alive()
    return out, removed


def test_a_lost_generator_node_is_counted_and_a_new_node_gets_the_generator(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit, old_b = cluster["audit"], cluster["b"].node_id
    out, removed = _lose_node_b_mid_run(
        cluster, tmp_path, monkeypatch, "workers.startup_timeout=120"
    )
    assert "summary" in out, out
    summary = out["summary"]
    assert summary["steps"] == 6
    led = summary["accounting"]["ledger"]
    assert led["balanced"] and led["lost_worker_died"] >= 8, led  # at least the R in flight
    assert summary["accounting"]["roles"]["generator/0"]["restarts"] == 1
    warnings = [m for m in cluster["log"] if m.startswith("warning:") and "lost" in m]
    assert warnings and str(led["lost_worker_died"]) in warnings[0], cluster["log"]
    # after the loss, the generator ran on the replacement node with the learner's weights
    after = [e for e in _audit(audit) if e["t"] > removed]
    published = {e["version"]: e["digest"] for e in _audit(audit) if e["kind"] == "published"}
    received = [e for e in after if e["kind"] == "received"]
    # every weight load after the loss happened on the replacement node, with the learner's
    # weights; whether one is logged before the last step depends on timing on a loaded
    # machine (seen once in four runs), so its presence is not asserted
    assert {e["node"] for e in received} <= {cluster["b"].node_id}
    assert old_b != cluster["b"].node_id
    assert all(published[e["version"]] == e["digest"] for e in received)


def test_workers_max_restarts_limits_restarts_on_the_cluster(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replayrl.errors import RunFailed

    out, _ = _lose_node_b_mid_run(cluster, tmp_path, monkeypatch, "workers.max_restarts=0")
    # no restart allowed: the lost generator fails the run, naming the limit
    assert isinstance(out.get("error"), RunFailed), out
    assert "workers.max_restarts=0" in str(out["error"])


def test_broadcast_weight_sync_reaches_the_other_node_with_the_learners_weights(
    cluster: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = time.time()
    summary = _run(
        cluster, tmp_path, "train.steps=3", "ray.weight_sync=broadcast", monkeypatch=monkeypatch
    )
    assert summary["steps"] == 3 and summary["accounting"]["ledger"]["balanced"]
    sync = summary["weight_sync"]
    assert sync["path"] == "broadcast" and sync["backend"] == "gloo"
    audit = [e for e in _audit(cluster["audit"]) if e["t"] > start]
    published = {e["version"]: e["digest"] for e in audit if e["kind"] == "published"}
    received = [e for e in audit if e["kind"] == "received"]
    # every sync went over the pair group (the object store path hands weights to `generate`,
    # which the audit does not see as a broadcast: the count ties the two)
    assert len(received) == sync["syncs"] >= 2, (received, sync)
    assert {e["node"] for e in received} == {cluster["b"].node_id}
    for e in received:  # each version the generator got is the learner's weights of it
        assert published[e["version"]] == e["digest"], e
    assert max(e["version"] for e in received) >= 1
    # fp32 here: 4 bytes a number, the whole trainable model each sync
    per_sync = sync["bytes"] / sync["syncs"]
    assert per_sync % 4 == 0 and per_sync > 0
