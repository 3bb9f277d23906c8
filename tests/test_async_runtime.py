"""Asynchronous runtimes: async-local processes and Ray actors, faults and the rollout ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.data.buffer import make_buffer
from replayrl.data.rollout_record import Rollout
from replayrl.methods.buffer import BufferSource
from replayrl.run.distributed.weights import SharedWeights, load_trainable, trainable_state
from replayrl.run.loops.asynchronous import AsyncSession
from replayrl.run.loops.pool import Delivery
from replayrl.run.records.ledger import ledger_stats, role_summary, rollout_ledger
from replayrl.run.start import train
from replayrl.run.state import Counters, summarize
from replayrl.storage.checkpoint import load_state
from tiny import TINY_RUN

CLI = [sys.executable, "-m", "replayrl.cli.main"]
# replay at y = B/R = 2 with a staleness bound: the learner paces itself on deliveries
ASYNC = [
    *TINY_RUN,
    "method.name=replay",
    "buffer.capacity=32",
    "train.batch_size=16",
    "train.threads=1",
    "workers.max_staleness=3",
]


def quiet(_: str) -> None:
    pass


def _rollout(version: int) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([3, 4, 5]),
        behaviour_logprobs=torch.tensor([-0.5, -0.25, -1.0]),
        reward=1.0,
        advantage=0.5,
        correct=True,
        group_id=7,
        policy_version=version,
        step=version,
        completion_text="42",
    )


# -- config ------------------------------------------------------------------------------------
FSDP = ["runtime=ray", "workers.learners=2", "train.sharding=fsdp"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["runtime=async-local", "workers.learners=2"], "workers.learners > 1 needs runtime=ray"),
        (
            ["runtime=ray", "workers.max_staleness=1", "workers.sync_every=2"],
            "workers.max_staleness=1 is below workers.sync_every=2",
        ),
        (
            ["runtime=ray", "workers.learners=3", "train.batch_size=16"],
            "must be divisible by workers.learners=3",
        ),
        (
            [
                "runtime=ray",
                "workers.learners=3",
                "method.name=replay",
                "buffer.capacity=32",
                "train.batch_size=24",
            ],
            "buffer.capacity=32 must be divisible by workers.learners=3",
        ),
        (
            [
                "runtime=ray",
                "workers.learners=2",
                "method.name=remix",
                "algorithm.loss_type=mix_ppg",
            ],
            "method.name=remix needs workers.learners=1",
        ),
        (["runtime=threads"], "runtime"),
        # sharded learners (train.sharding=fsdp): what they do not run, refused by name
        (["train.sharding=fsdp"], "workers.learners >= 2"),
        (["runtime=ray", "train.sharding=fsdp"], "workers.learners >= 2"),
        (["runtime=async-local", "train.sharding=fsdp"], "use runtime=ray"),
        (FSDP + ["kl.beta=0.04", "kl.target=convex"], "train.sharding=fsdp: kl.target=convex"),
        (FSDP + ["train.sharding_replicas=3"], "sharding_replicas=3 must divide"),
    ],
)
def test_async_config_errors_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(">", ".")):
        load_config(None, overrides)


# -- pure pieces -------------------------------------------------------------------------------
def test_ledger_balances_hand_computed() -> None:
    onpolicy = {"size": 3, "evicted": 2, "consumed": 10, "dropped_stale": 1, "pushed": 16}
    led = rollout_ledger(20, 3, 1, [onpolicy])
    assert led["generated"] == 20 and led["balanced"]  # 3 + 1 + 3 + 2 + 10 + 1 = 20
    assert not rollout_ledger(21, 3, 1, [onpolicy])["balanced"]  # one rollout unaccounted
    # ReMix's window discarded at reincarnation: its 4 rollouts are accounted for
    window = {"size": 0, "evicted": 6, "consumed": 0, "dropped_stale": 0, "pushed": 10}
    retired = {"discarded_at_reincarnation": 4}
    assert rollout_ledger(30, 3, 1, [onpolicy, window], retired=retired)["balanced"]
    # as a filtered term they would count as never pushed: the window's pushes do not balance
    assert not rollout_ledger(30, 3, 1, [onpolicy, window], filtered=retired)["balanced"]


def test_replay_buffer_draws_are_not_removals() -> None:
    buf = make_buffer("replay", 4)
    buf.push([_rollout(0) for _ in range(6)])
    buf.sample(3)
    st = ledger_stats(buf)
    assert (st["size"], st["evicted"], st["consumed"], st["sampled"]) == (4, 2, 0, 3)
    assert rollout_ledger(6, 0, 0, [st])["balanced"]


def _pacing(stale: int, fresh: int, sampled: int) -> SimpleNamespace:
    """An AsyncSession's pacing state without processes: R = 8, B = 16, y = 2, bound 3; the
    learner is at version 5, so rollouts of version 0 are stale and dropped when sampled."""
    cfg = load_config(None, [*ASYNC, "runtime=async-local"])
    buf = make_buffer("replay", 64, max_staleness=3)
    buf.push([_rollout(0) for _ in range(stale)] + [_rollout(5) for _ in range(fresh)])
    s = SimpleNamespace(
        cfg=cfg,
        buffer=buf,
        source=BufferSource(buf, 16, 1),
        log=quiet,
        learner=SimpleNamespace(version=5),
        counters=SimpleNamespace(rollouts_sampled=sampled),
        newest_delivered=5,
        ratio=2.0,
    )
    s._pushed = lambda: AsyncSession._pushed(s)
    s._has_usable_data = lambda B: AsyncSession._has_usable_data(s, B)
    return s


def test_generators_never_hold_while_the_learner_lacks_usable_rollouts() -> None:
    # 48 pushed, 64 sampled, every rollout 5 versions old (bound 3): holding the generators
    # would deadlock the run (seen when a restarted generator fell behind)
    s = _pacing(stale=48, fresh=0, sampled=64)
    assert not AsyncSession.ready(s, 16)
    assert not AsyncSession.hold(s, 16)
    ahead = _pacing(stale=0, fresh=48, sampled=64)
    assert AsyncSession.hold(ahead, 16)  # 48 usable >= (64 + 16) / y + R: a batch ahead
    assert AsyncSession.ready(ahead, 16)  # 64 + 16 <= y * 48


def test_stale_drops_do_not_count_towards_the_replay_ratio() -> None:
    # 48 pushed but 32 dropped as stale: 16 usable rollouts allow y * 16 = 32 draws in all
    s = _pacing(stale=32, fresh=16, sampled=16)
    assert AsyncSession.ready(s, 16)  # 16 + 16 <= 32
    s.counters.rollouts_sampled = 32
    assert not AsyncSession.ready(s, 16)  # 32 + 16 > 32: wait for fresh rollouts
    assert not AsyncSession.hold(s, 16)  # and let the generators make them


def test_role_summary_mu_and_gamma() -> None:
    roles = {
        "generator/0": {"busy_s": 10.0, "rollouts": 100},  # 0.1 s per rollout
        "learner/0": {"busy_s": 4.0, "rollouts": 200},  # 0.02 s per rollout
    }
    s = role_summary(roles, workers=3, trainers=1)
    assert s["mu"] == pytest.approx(5.0)
    assert s["gamma"] == pytest.approx((1 + 3) / (1 + 5.0))


def test_summary_mu_is_the_step_median_and_accounting_mu_the_busy_time_ratio() -> None:
    # steps with ratios 3, 8, 1 (15 s generating and 6 s training 30 rollouts in all)
    c = Counters(
        mu_per_step=[3.0, 8.0, 1.0],
        generation_seconds=15.0,
        training_seconds=6.0,
        rollouts_generated=30,
        rollouts_trained=30,
        step=3,
    )
    cfg = load_config(None, TINY_RUN)
    run = {"policy_version": 3, "run_dir": "r", "num_eval_prompts": 0, "num_parameters": 1}
    s = summarize(cfg, c, [], model_path=None, **run)
    assert s["mu_median"] == pytest.approx(3.0)  # median of the steps
    assert s["accounting"]["mu"] == pytest.approx(2.5)  # (15 / 30) / (6 / 30): run totals
    assert summarize(cfg, Counters(), [], model_path=None, **run)["mu_median"] is None


def test_shared_weights_publish_then_pull() -> None:
    src, dst = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    shared = SharedWeights(src)
    assert shared.pull(dst, -1) == -1  # nothing published yet
    with torch.no_grad():
        src.weight.add_(1.0)
    shared.publish(src, 5)
    assert shared.pull(dst, -1) == 5
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)
    assert shared.pull(dst, 5) == 5  # unchanged version: no copy needed


def test_weight_sync_rejects_unknown_names_and_shapes() -> None:
    state = trainable_state(torch.nn.Linear(3, 2))
    with pytest.raises(KeyError, match="no parameter 'weight'"):
        load_trainable(torch.nn.Sequential(torch.nn.Linear(3, 2)), state)
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 3\) from the learner"):
        load_trainable(torch.nn.Linear(3, 4), state)


def test_delivery_round_trips_through_a_spool_file(tmp_path: Path) -> None:
    d = Delivery(0, 1, 3, 2, [_rollout(2)], {"reward/mean": 1.0}, 8, 24, 1, 0, None, 0.5, 0.1)
    d.save(tmp_path / "d.pt")
    back = Delivery.load(tmp_path / "d.pt")
    assert not list(tmp_path.glob(".*.tmp"))
    assert (back.worker_id, back.incarnation, back.seq, back.version) == (0, 1, 3, 2)
    assert torch.equal(back.rollouts[0].behaviour_logprobs, d.rollouts[0].behaviour_logprobs)
    assert back.rollouts[0].completion_text == "42" and back.generated == 8


class _FakeRay:
    """Just enough of `ray` for RayDriver: the learner actor's run "takes" 50 polls and a
    Ctrl-C (SIGINT to this process) arrives at the first; it ends early once asked to stop."""

    def __init__(self) -> None:
        self.polls, self.stop_requested = 0, False

    def is_initialized(self) -> bool:
        return True  # joined, not started: RayDriver neither inits nor shuts down

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}  # no GPU: the actors ask for none

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": self.cluster_resources()}]

    def remote(self, **_: object):
        return lambda cls: SimpleNamespace(options=lambda **_: SimpleNamespace(remote=self._actor))

    def _actor(self, *_: object) -> SimpleNamespace:
        return SimpleNamespace(
            run=SimpleNamespace(remote=lambda: "run"),
            request_stop=SimpleNamespace(remote=lambda: "stop"),
        )

    def _poll(self) -> bool:
        self.polls += 1
        if self.polls == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return self.stop_requested or self.polls >= 50

    def wait(self, refs: list, timeout: float | None = None, **_: object) -> tuple[list, list]:
        return (refs, []) if self._poll() else ([], refs)

    def get(self, ref: str, timeout: float | None = None) -> dict | None:
        if ref == "stop":
            self.stop_requested = True
            return None
        while not self._poll():  # a blocking get waits for the whole run
            pass
        if self.stop_requested:
            return {"interrupted": True, "step": 3, "ckpt": "step_000003"}
        return {"accounting": {"ledger": rollout_ledger(0, 0, 0, []), **role_summary({}, 1, 1)}}


@pytest.mark.parametrize(
    "inherited", [signal.SIG_IGN, signal.default_int_handler], ids=["ignored", "default"]
)
def test_ray_driver_stops_on_ctrl_c_even_if_started_with_sigint_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inherited: object
) -> None:
    # a background job of a non-interactive shell (a CI script) starts with SIGINT ignored:
    # the Ray driver then ignored Ctrl-C and ran to its last step, where sync and async-local
    # runs (their own SIGINT handler) stopped with a checkpoint
    from replayrl.run.distributed import ray_runtime

    fake = _FakeRay()
    monkeypatch.setattr(ray_runtime, "_ray", lambda: fake)
    cfg = load_config(None, [*ASYNC, *RAY])
    logs: list[str] = []
    previous = signal.signal(signal.SIGINT, inherited)  # type: ignore[arg-type]
    try:
        with pytest.raises(KeyboardInterrupt):  # what the CLI turns into "interrupted", 130
            ray_runtime.RayDriver(cfg, tmp_path, log=logs.append).run()
        assert signal.getsignal(signal.SIGINT) is inherited  # put back as found
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fake.stop_requested and fake.polls < 50  # stopped early, through request_stop
    assert any("interrupted at step 3" in line for line in logs), logs


def test_sync_runs_report_a_balanced_ledger(tmp_path: Path) -> None:
    cfg = load_config(None, [*TINY_RUN, f"logging.run_dir={tmp_path}", "train.steps=2"])
    acc = train(cfg, log=quiet)["accounting"]
    assert acc["ledger"]["balanced"] and acc["ledger"]["generated"] == 16
    assert acc["ledger"]["consumed"] == 16  # the on-policy queue removes what it hands out
    assert set(acc["roles"]) == {"generator/0", "learner/0"} and acc["mu"] > 0


# -- end to end --------------------------------------------------------------------------------
def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    # the run appends while tests poll: a last line without its newline may be mid-write
    complete = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in complete if line.strip()]


def _check_run(summary: dict, run: Path, steps: int, bound: int) -> None:
    assert summary["steps"] == steps and summary["policy_version"] == steps
    led = summary["accounting"]["ledger"]
    assert led["balanced"], led
    assert led["generated"] > 0 and led["in_buffer"] > 0
    ages = [m["batch/age_max"] for m in _metrics(run) if "batch/age_max" in m]
    assert len(ages) == steps and max(ages) <= bound
    roles = summary["accounting"]["roles"]
    assert roles["learner/0"]["batches"] == steps and roles["generator/0"]["rollouts"] > 0
    assert summary["accounting"]["mu"] > 0 and summary["accounting"]["gamma"] > 0


def test_async_local_trains_within_the_staleness_bound(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            *ASYNC,
            "runtime=async-local",
            f"logging.run_dir={tmp_path}",
            "train.steps=4",
            "workers.on_stale=wait",
        ],
    )
    summary = train(cfg, log=quiet)
    run = tmp_path / "demo"
    _check_run(summary, run, 4, bound=3)
    assert not any((run / "spool").glob("d-*"))  # every delivered batch was ingested
    assert set(json.loads((run / "workers.json").read_text())) == {"learner/0", "generator/0"}


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "train", *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ
    )


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(m.get("step", 0) >= step and "train/loss" in m for m in _metrics(run)):
            return
        assert proc.poll() is None, f"the run ended before step {step}"
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} within {timeout} s")


def _kill_generator(run: Path, proc: subprocess.Popen) -> None:
    _wait_for_step(run, proc, 1)
    pid = json.loads((run / "workers.json").read_text())["generator/0"]
    os.kill(pid, signal.SIGKILL)


def _kill_generator_mid_run(tmp_path: Path, runtime: list[str]) -> dict:
    run, log = tmp_path / "demo", tmp_path / "log.txt"
    proc = _start([*ASYNC, *runtime, f"logging.run_dir={tmp_path}", "train.steps=40"], log)
    try:
        _kill_generator(run, proc)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
    assert "generator worker 0 died" in log.read_text()
    summary = json.loads((run / "summary.json").read_text())
    _check_run(summary, run, 40, bound=3)
    assert summary["accounting"]["roles"]["generator/0"]["restarts"] == 1
    return summary


def test_async_local_survives_a_killed_generator(tmp_path: Path) -> None:
    _kill_generator_mid_run(tmp_path, ["runtime=async-local"])


def test_async_local_ctrl_c_leaves_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    _ctrl_c_then_resume(tmp_path, ["runtime=async-local"])


def _ctrl_c_then_resume(tmp_path: Path, runtime: list[str], kill_first: bool = False) -> dict:
    """Ctrl-C mid-run (optionally after killing a generator), check the checkpoint, resume."""
    run, log = tmp_path / "demo", tmp_path / "log.txt"
    proc = _start([*ASYNC, *runtime, f"logging.run_dir={tmp_path}", "train.steps=400"], log)
    try:
        if kill_first:
            _kill_generator(run, proc)
            deadline = time.monotonic() + 240
            while "restarting it" not in log.read_text():
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.1)
        step = max((m.get("step", 0) for m in _metrics(run)), default=0)
        _wait_for_step(run, proc, step + 2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)  # deadlines, not pacing: generous for a loaded machine
    finally:
        proc.kill()
    assert code != 0 and "interrupted at step" in log.read_text(), log.read_text()[-2000:]
    ckpt = (run / "checkpoints" / "latest").read_text().strip()
    state = load_state(run / "checkpoints" / ckpt)
    stopped_at = state["counters"]["step"]
    assert 2 <= stopped_at < 400
    # the checkpoint's own ledger balances: rollouts delivered after Ctrl-C are in its buffer
    c, buf = state["counters"], state["buffer"]["counters"]
    assert c["rollouts_generated"] == (
        c["rollouts_dropped_reward_error"] + c["rollouts_lost_worker_died"] + buf["pushed"]
    )
    in_buffer = len(state["buffer"]["order"])
    assert buf["pushed"] == in_buffer + buf["evicted"] + buf["dropped_stale"]
    done = subprocess.run(
        [*CLI, "train", "--resume", str(run), f"train.steps={stopped_at + 3}"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=600,  # a resumed Ray run took 233 s on a loaded 2-core machine
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == stopped_at + 3
    assert summary["accounting"]["ledger"]["balanced"]
    return summary


# Ray tests are marked and skipped on their own when ray is missing (conftest.py); the
# async-local tests above always run
RAY = ["runtime=ray", "ray.num_cpus=2", "ray.generator_num_cpus=0.5", "ray.learner_num_cpus=0.5"]


@pytest.mark.ray
def test_ray_survives_a_killed_generator_then_ctrl_c_resumes(tmp_path: Path) -> None:
    summary = _ctrl_c_then_resume(tmp_path, RAY, kill_first=True)
    assert summary["runtime"] == "ray"
    assert summary["accounting"]["roles"]["generator/0"]["restarts"] == 1  # kept over resume
    ages = [m["batch/age_max"] for m in _metrics(tmp_path / "demo") if "batch/age_max" in m]
    assert ages and max(ages) <= 3


@pytest.mark.ray
def test_ray_two_data_parallel_learners_stay_in_sync(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [*ASYNC, *RAY, "workers.learners=2", f"logging.run_dir={tmp_path}", "train.steps=3"],
    )
    summary = train(cfg, log=quiet)
    run = tmp_path / "demo"
    _check_run(summary, run, 3, bound=3)
    roles = summary["accounting"]["roles"]
    # each learner trained its own B / T = 8 rollouts per step, from its own shard
    assert roles["learner/0"]["rollouts"] == roles["learner/1"]["rollouts"] == 3 * 8
    assert summary["learners_in_sync"] is True
    assert summary["accounting"]["trainers"] == 2


def _poll_stop_forever(flag) -> None:
    while True:
        flag.is_set()


def test_a_generator_killed_mid_poll_never_blocks_the_learners_stop_flag() -> None:
    # a multiprocessing Event's is_set() takes a lock shared with the workers: a worker
    # SIGKILLed inside its own poll left the learner blocked forever in its next is_set()
    # (the async-local killed-generator test hung). The pool's flag takes no lock.
    import multiprocessing as mp
    import threading

    from replayrl.run.distributed.local import StopFlag

    ctx = mp.get_context("fork")
    flag = StopFlag(ctx)
    for _ in range(10):
        p = ctx.Process(target=_poll_stop_forever, args=(flag,), daemon=True)
        p.start()
        time.sleep(0.02)  # inside its poll loop
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        seen: list[bool] = []
        t = threading.Thread(target=lambda out=seen: out.append(flag.is_set()), daemon=True)
        t.start()
        t.join(timeout=30)  # only a deadlock waits it out: generous for a loaded machine
        assert seen == [False], "the learner blocked on a lock the killed worker held"
    flag.set()
    assert flag.is_set()


def test_ray_followers_trained_rollouts_and_tokens_are_counted(monkeypatch) -> None:
    """With T learners each rank trains B / T: the run's trained rollouts and tokens (the
    summary's, its compute estimate's and bench/targets.py's) are every rank's, not rank
    0's share alone."""
    from replayrl.run.distributed import ray_runtime

    class Call:
        def __init__(self, result: dict[str, float]) -> None:
            self.result = result

        def remote(self, *args: object) -> dict[str, float]:
            return self.result

    def rank0_step(self: object, B: int) -> None:  # rank 0's share: 4 rollouts, 2 passes
        s.counters.add_trained(batch_tokens=10, batch_size=B, epochs=2, seconds=0.5)
        s.counters.rollouts_sampled += B

    monkeypatch.setattr(AsyncSession, "learner_step", rank0_step)
    monkeypatch.setattr(ray_runtime, "_get", lambda refs, what: refs)
    s = object.__new__(ray_runtime.RayAsyncTrainer)
    follower = SimpleNamespace(
        train_step=Call({"busy_s": 0.5, "rollouts": 4 * 2, "tokens": 12 * 2})
    )
    s.followers, s.clocks, s.counters = [follower], {}, Counters()
    s.learner = SimpleNamespace(version=0)
    shards = [None, SimpleNamespace(handle=None)]  # rank 1 samples its own shard
    s.source = SimpleNamespace(buffer=SimpleNamespace(shards=shards))
    ray_runtime.RayAsyncTrainer.learner_step(s, 8)
    c = s.counters
    assert c.step == 1 and c.rollouts_sampled == 8
    assert c.rollouts_trained == 8 * 2  # both ranks' 4 rollouts, 2 passes each
    assert c.tokens_trained == (10 + 12) * 2
    assert s.clocks["learner/1"].tokens == 12 * 2
