"""The asynchronous loop (run/loops/asynchronous.py) driven in one process: a GeneratorPool
stand-in generates with the session's own producer when polled, with hand-set clocks, so the
real `run_async` ingests, paces, trains, publishes and accounts without worker processes.
Fast enough for `make mutate` (the async-local tests that spawn workers are not), and exact:
every clock and count below is computed by hand from what the stand-in delivered."""

from __future__ import annotations

import math

import pytest

from replayrl.run.loops.asynchronous import AsyncSession, run_async, staleness_bounded
from replayrl.run.loops.pool import Delivery


class InProcessPool:
    """Delivers one producer batch per poll (none while held or paused), 0.5 s busy and
    0.25 s idle each by its clocks; records publishes, holds and pauses."""

    BUSY, IDLE = 0.5, 0.25

    def __init__(self, s: AsyncSession, lost: int = 0, restarts: int = 0) -> None:
        self.s, self.lost, self.n_restarts = s, lost, restarts
        self.models: list[object] = []
        self.version = -1
        self.published: list[int] = []
        self.holds: list[bool] = []
        self.pauses: list[bool] = []
        self.delivered: list[Delivery] = []
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def publish(self, model: object, version: int) -> None:
        self.published.append(version)
        self.models.append(model)
        self.version = version

    def poll(self) -> list[Delivery]:
        if (self.holds and self.holds[-1]) or (self.pauses and self.pauses[-1]):
            return []
        n = len(self.delivered)
        p = self.s.producer.produce(self.version, n, n * 1_000_000)
        d = Delivery(
            worker_id=0,
            incarnation=0,
            seq=n,
            version=self.version,
            rollouts=p.rollouts,
            stats={**p.stats, "x/nan": math.nan},
            generated=p.generated,
            tokens=p.tokens,
            dropped_reward_error=p.dropped_reward_error,
            skipped_too_long=p.skipped_too_long,
            first_error=p.first_error,
            busy_s=self.BUSY,
            idle_s=self.IDLE,
            # the first batch without the optional extras (an older worker's delivery)
            extra={"dropped_reward_timeout": 0, "reward_seconds": 0.125} if n else {},
        )
        self.delivered.append(d)
        return [d]

    def check(self) -> list[Delivery]:
        return []

    def set_hold(self, hold: bool) -> None:
        self.holds.append(hold)

    def pause(self, paused: bool) -> None:
        self.pauses.append(paused)

    def stop(self) -> list[Delivery]:
        self.stopped = True
        return []

    def pids(self) -> dict[str, int]:
        return {"generator/0": 12345}

    def restarts(self) -> dict[str, int]:
        # generator/1: a worker that was restarted before it delivered anything
        return {"generator/0": self.n_restarts, "generator/1": self.n_restarts}


def _run(tmp_path, *extra: str, lost: int = 0, restarts: int = 0, logs: list | None = None):
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "rewards=[{name: digits_format}]",
        "runtime=async-local",
        "workers.generators=1",
        *extra,
    )
    (tmp_path / "run").mkdir()
    pools: list[InProcessPool] = []

    def factory(s: AsyncSession) -> InProcessPool:
        pools.append(InProcessPool(s, lost, restarts))
        return pools[-1]

    log = logs.append if logs is not None else (lambda _: None)
    s = AsyncSession(cfg, tmp_path / "run", factory, log=log)
    summary = run_async(s)
    return s, pools[0], summary


def test_the_async_loop_in_process_trains_paces_and_accounts(tmp_path):
    from replayrl.run.metrics import read_metrics

    logs: list[str] = []
    s, pool, summary = _run(
        tmp_path,
        "method.name=replay",
        "buffer.capacity=64",
        "train.batch_size=16",
        "workers.replay_ratio=2",
        "workers.sync_every=2",
        "train.steps=4",
        "train.epochs=2",
        lost=3,
        restarts=1,
        logs=logs,
    )
    c, cfg = s.counters, s.cfg
    assert s.ratio == 2  # workers.replay_ratio as set
    assert any("runtime async-local: 1 generator worker(s)" in x for x in logs)  # the run's log
    assert all(m is s.model for m in pool.models)  # the learner's weights, every publish
    assert c.step == 4 and s.learner.version == 4
    assert pool.started and pool.stopped
    # weights published at the start and every sync_every = 2 steps
    assert pool.published == [0, 2, 4]
    # the replay-ratio pace: never more than y = 2 draws per rollout pushed
    pushed = sum(len(d.rollouts) for d in pool.delivered)
    assert c.rollouts_sampled == 4 * 16 <= 2 * pushed
    # the generator's clock and the run's generation seconds are the deliveries' own
    g = s.clocks["generator/0"]
    n = len(pool.delivered)
    assert (g.busy_s, g.idle_s, g.batches) == (n * 0.5, n * 0.25, n)
    assert g.rollouts == sum(d.generated for d in pool.delivered)
    assert g.tokens == sum(d.tokens for d in pool.delivered)
    assert c.generation_seconds == pytest.approx(n * 0.5)
    # the learner's clock: one batch per step, rollouts x epochs
    lc = s.learner_clock
    assert lc.batches == 4 and lc.rollouts == 4 * 16 * cfg.train.epochs and lc.busy_s > 0
    assert lc.tokens == c.tokens_trained > 0  # tokens per pass x epochs, as the counters
    # reward seconds from the deliveries that report them (the first batch does not)
    assert c.reward_seconds == pytest.approx(0.125 * (n - 1))
    # worker restarts reported by the pool reach each worker's clock, a new one included
    assert s.clocks["generator/0"].restarts == 1 and s.clocks["generator/1"].restarts == 1
    # one mu per step: the generators' seconds per rollout so far vs the step's training
    assert len(c.mu_per_step) == 4 and all(m > 0 for m in c.mu_per_step)
    # the pool's 3 lost rollouts (a worker died with them) are generated, never delivered
    assert c.rollouts_lost_worker_died == 3
    assert c.rollouts_generated == g.rollouts + 3
    assert s.accounting()["ledger"]["balanced"]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "async/newest_generator_version" in r]
    assert len(steps) == 4
    last = steps[-1]
    assert last["async/newest_generator_version"] == max(d.version for d in pool.delivered)
    assert last["async/rollouts_lost_worker_died"] == 3.0
    assert last["rollouts/dropped_reward_timeout"] == 0.0
    assert "x/nan" not in last  # NaN stats are left out of the step's mean, not averaged in
    assert (tmp_path / "run" / "workers.json").is_file()
    # the clocks survive in the counters (what a resumed run starts from)
    assert c.roles["generator/0"]["busy_s"] == n * 0.5
    assert c.roles["learner/0"]["batches"] == 4


def test_on_policy_async_waits_for_a_full_fresh_batch(tmp_path):
    s, pool, _ = _run(tmp_path, "train.steps=3")
    assert s.ratio == s.cfg.batch_size / s.cfg.rollouts_per_step  # replay_ratio auto: y = B/R
    c = s.counters
    R = s.cfg.rollouts_per_step
    assert c.step == 3 and c.rollouts_sampled == 3 * s.cfg.batch_size
    # on-policy: generators hold once a batch is waiting, so at most one batch ahead
    assert sum(len(d.rollouts) for d in pool.delivered) <= (3 + 1) * R
    assert pool.published == [0, 1, 2, 3]  # sync_every = 1 by default


def test_staleness_bounded_takes_the_tighter_bound():
    from replayrl.config.schema import load_config

    base = ["runtime=async-local", "rewards=[{name: digits_format}]"]
    cfg = load_config("replay", [*base, "workers.max_staleness=2"])
    assert staleness_bounded(cfg).buffer.max_staleness == 2
    assert cfg.buffer.max_staleness is None  # a copy: the config itself is unchanged
    loose = load_config("replay", [*base, "workers.max_staleness=5", "buffer.max_staleness=3"])
    assert staleness_bounded(loose) is loose  # the buffer's own bound is already tighter
    unbounded = load_config("replay", base)  # workers.max_staleness unset: nothing to add
    assert staleness_bounded(unbounded) is unbounded


def test_role_clocks_restore_from_a_saved_run_and_default_to_zero():
    from replayrl.run.loops.asynchronous import _clock

    saved = {"busy_s": 1.5, "idle_s": 0.5, "rollouts": 64.0, "tokens": 900.0, "batches": 2.0}
    c = _clock({**saved, "restarts": 1.0})
    assert (c.busy_s, c.idle_s, c.rollouts, c.tokens, c.batches, c.restarts) == (
        1.5,
        0.5,
        64,
        900,
        2,
        1,
    )
    assert isinstance(c.rollouts, int) and isinstance(c.batches, int)
    z = _clock(None)
    assert (z.busy_s, z.idle_s, z.rollouts, z.tokens, z.batches, z.restarts) == (0, 0, 0, 0, 0, 0)


def test_step_stats_average_what_was_delivered_since_the_last_step(tmp_path):
    s, _, _ = _run(tmp_path, "train.steps=1")
    s._stats = {"train/loss": 0.25}
    s.fresh, s.fresh_stats = [], {"gen/len": [1.0, 3.0, 8.0]}
    stats = s.step_stats()
    assert stats["gen/len"] == pytest.approx(4.0) and stats["train/loss"] == 0.25
    assert stats["rollouts/dropped_reward_error"] == 0.0
    assert stats["rollouts/dropped_reward_timeout"] == 0.0
    assert s.fresh == [] and not s.fresh_stats  # the next step starts afresh
