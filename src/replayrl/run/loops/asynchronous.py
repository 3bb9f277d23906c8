"""The asynchronous loop (async-local and ray): the learner side.

Generators produce continuously with the last weights they were given; the learner pushes
their deliveries into the run's batch source (`replayrl.methods.buffer`, the synchronous
loop's: a buffer, or ReMix's fresh + window mix with reincarnation) and takes a step whenever
the source can serve a batch. The loss, evaluation, metrics, checkpoints and summary are the
synchronous session's.

Pacing, so that async runs compare with sync ones at the same replay ratio y = B / R:
the learner waits while it would use rollouts more than y times on average
(`workers.replay_ratio`), and generators hold while they are a batch ahead of what the
learner needs (on-policy: while the queue already holds a batch).
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replayrl.config.schema import Config
from replayrl.data.buffer import Buffer
from replayrl.data.rollout_record import Rollout
from replayrl.design.theory import cost_ratio
from replayrl.rollout.producer import Production
from replayrl.run.components import build_buffer
from replayrl.run.loops.pool import Delivery, GeneratorPool
from replayrl.run.loops.steps import learn
from replayrl.run.metrics import Progress
from replayrl.run.records.ledger import RoleClock
from replayrl.run.session import Session, StopOnSignal, WholeLearner
from replayrl.storage.io import atomic_write_json

Log = Callable[[str], None]
_IDLE_SLEEP_S = 0.01


def _clock(d: dict[str, float] | None) -> RoleClock:
    d = d or {}
    return RoleClock(
        busy_s=d.get("busy_s", 0.0),
        idle_s=d.get("idle_s", 0.0),
        rollouts=int(d.get("rollouts", 0)),
        tokens=int(d.get("tokens", 0)),
        batches=int(d.get("batches", 0)),
        restarts=int(d.get("restarts", 0)),
    )


def staleness_bounded(cfg: Config) -> Config:
    """The config whose buffer also enforces `workers.max_staleness` (a copy if it changes)."""
    bound = cfg.workers.max_staleness
    if bound is None or (
        cfg.buffer.max_staleness is not None and bound >= cfg.buffer.max_staleness
    ):
        return cfg
    out = cfg.model_copy(deep=True)
    out.buffer.max_staleness = bound
    return out


class AsyncSession(Session):
    """A session whose producer runs elsewhere (a GeneratorPool) concurrently with training."""

    # rollouts come from the pool's workers: no vLLM engine (and no GPU share) in the learner
    builds_engine = False

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        pool_factory: Callable[[AsyncSession], GeneratorPool],
        log: Log = print,
        resume: bool = False,
        outputs: WholeLearner | None = None,
    ) -> None:
        super().__init__(cfg, run_dir, log=log, resume=resume, outputs=outputs)
        self.pool_factory = pool_factory
        self.pool: GeneratorPool | None = None
        c = self.counters
        self.clocks = {k: _clock(v) for k, v in c.roles.items()}
        self.learner_clock = self.clocks.setdefault("learner/0", RoleClock())
        self.lost_before = c.rollouts_lost_worker_died  # from earlier sessions of this run
        self.restarts_before = {k: v.restarts for k, v in self.clocks.items()}
        self.newest_delivered = self.learner.version - 1
        self.fresh: list[Rollout] = []  # delivered since the last step (text metrics)
        self.fresh_stats: dict[str, list[float]] = defaultdict(list)
        w = cfg.workers
        ratio = w.replay_ratio
        self.ratio = cfg.batch_size / cfg.rollouts_per_step if ratio == "auto" else ratio

    def make_buffer(self, cfg: Config) -> Buffer:
        """The configured buffer, with the staleness bound of `workers.max_staleness`."""
        return build_buffer(staleness_bounded(cfg))

    # -- deliveries --------------------------------------------------------------------------
    def ingest(self, deliveries: list[Delivery]) -> None:
        c = self.counters
        for d in deliveries:
            self.account(
                Production(
                    d.rollouts,
                    d.stats,
                    d.generated,
                    d.tokens,
                    d.dropped_reward_error,
                    d.skipped_too_long,
                    d.first_error,
                    d.busy_s,
                    dropped_reward_timeout=int(d.extra.get("dropped_reward_timeout", 0)),
                    reward_seconds=float(d.extra.get("reward_seconds", 0.0)),
                    dropped_no_reward=int(d.extra.get("dropped_no_reward", 0)),
                )
            )
            clock = self.clocks.setdefault(f"generator/{d.worker_id}", RoleClock())
            clock.busy_s += d.busy_s
            clock.idle_s += d.idle_s
            clock.rollouts += d.generated
            clock.tokens += d.tokens
            clock.batches += 1
            c.generation_seconds += d.busy_s
            assert self.source is not None
            self.source.push(d.rollouts)
            self.newest_delivered = max(self.newest_delivered, d.version)
            self.fresh.extend(d.rollouts)
            for k, v in d.stats.items():
                if not (isinstance(v, float) and math.isnan(v)):
                    self.fresh_stats[k].append(v)
        if self.pool is not None:
            lost = self.lost_before + self.pool.lost - c.rollouts_lost_worker_died
            c.rollouts_lost_worker_died += lost
            c.rollouts_generated += lost  # sampled (at least in part), never delivered
            for name, n in self.pool.restarts().items():  # plus earlier sessions' restarts
                self.clocks.setdefault(name, RoleClock()).restarts = (
                    self.restarts_before.get(name, 0) + n
                )

    # -- pacing ------------------------------------------------------------------------------
    def _pushed(self) -> int:
        """Rollouts the learner could use: pushed minus those dropped as too stale. Counting
        the dropped ones would let the learner reuse the few usable rollouts far more than
        y times each while lagging generators deliver only stale ones."""
        st = self.buffer.stats()
        return int(st["pushed"] - st["dropped_stale"])

    def _has_usable_data(self, B: int) -> bool:
        """Can the batch source serve a batch the staleness bounds allow the learner to use?"""
        cfg, v = self.cfg, self.learner.version
        assert self.source is not None
        self.source.before_step(self.learner, self.counters, self.log)  # ReMix: step T
        self.buffer.sample(0, current_version=v)  # drops stale rollouts (counted)
        need = 1 if cfg.buffer.with_replacement else B
        if self.source.available() < need:
            return False
        w = cfg.workers
        if w.on_stale == "wait" and w.max_staleness is not None:
            if self.newest_delivered < v - w.max_staleness:
                return False
        return True

    def ready(self, B: int) -> bool:
        """Can the learner take a step now without breaking a bound?"""
        if not self._has_usable_data(B):
            return False
        if self.cfg.method_spec.buffer == "replay" and self.ratio is not None:
            return self.counters.rollouts_sampled + B <= self.ratio * self._pushed()
        return True

    def hold(self, B: int) -> bool:
        """Should generators wait? Only when a batch ahead of what the learner can use.

        Never while the learner lacks usable data: rollouts dropped as stale still count as
        pushed, so the replay-ratio pace alone would hold the generators while the learner
        waits for fresh rollouts (a deadlock seen when a restarted generator fell behind).
        """
        cfg, c = self.cfg, self.counters
        if cfg.method_spec.buffer == "onpolicy":
            assert self.source is not None
            return self.source.available() >= B
        if self.ratio is None or not self._has_usable_data(B):
            return False
        return self._pushed() >= (c.rollouts_sampled + B) / self.ratio + cfg.rollouts_per_step

    # -- the loop ----------------------------------------------------------------------------
    def timed_eval(self) -> dict[str, float]:
        """Generators pause during evaluation, which is excluded from wall time."""
        if self.pool is not None:
            self.pool.pause(True)
        try:
            return super().timed_eval()
        finally:
            if self.pool is not None:
                self.pool.pause(False)

    def write_pids(self) -> None:
        assert self.pool is not None
        pids = {"learner/0": os.getpid(), **self.pool.pids()}
        atomic_write_json(self.run_dir / "workers.json", pids)

    def stopping(self, stop: StopOnSignal) -> bool:
        return stop.requested or self.stop_requested()

    def stop_requested(self) -> bool:
        """Another way to ask for a clean stop (the Ray learner actor's)."""
        return False

    def learner_step(self, B: int) -> None:
        """One step on a batch from the source (`B`: this learner's share of it)."""
        c, version = self.counters, self.learner.version
        assert self.source is not None
        self.source.before_step(self.learner, c, self.log)  # ReMix: reincarnation at step T
        batch, epochs = self.source.sample(version, B)
        c.rollouts_sampled += len(batch)  # the replay-ratio pace (`ready`) counts on it
        # re-decide before training: the batch just taken may free generators to work
        # during this step (otherwise an on-policy run never overlaps)
        assert self.pool is not None
        self.pool.set_hold(self.hold(B))
        self._stats = {}
        t_train = learn(
            self.learner,
            c,
            batch,
            epochs,
            self.fresh,
            self._stats,
            cfg=self.cfg,
            shuffle_rng=self.parts.shuffle_rng,
            check_training=self.check_training,
            completions=self.completions,
            engine=self.engine,
        )
        self.learner_clock.rollouts += len(batch) * epochs
        self.learner_clock.tokens += sum(r.completion_ids.numel() for r in batch) * epochs
        self.learner_clock.batches += 1
        gen = [k for k in self.clocks if k.startswith("generator")]
        g_busy = sum(self.clocks[k].busy_s for k in gen)
        g_n = sum(self.clocks[k].rollouts for k in gen)
        # running mu: the generators' seconds per rollout so far vs this step's training
        mu = cost_ratio(g_busy, g_n, t_train, len(batch) * epochs)
        if mu is not None:
            c.mu_per_step.append(mu)

    def step_stats(self) -> dict[str, float]:
        stats = dict(self._stats)
        for k, vs in self.fresh_stats.items():
            stats[k] = sum(vs) / len(vs)
        c = self.counters
        if self.fresh:  # the rollouts delivered since the last step (a step may have none)
            self.watch_signal(self.fresh, stats, c.step)
        stats["rollouts/dropped_reward_error"] = float(c.rollouts_dropped_reward_error)
        stats["rollouts/dropped_reward_timeout"] = float(c.rollouts_dropped_reward_timeout)
        stats["rollouts/dropped_no_reward"] = float(c.rollouts_dropped_no_reward)
        stats["async/learner_idle_s"] = self.learner_clock.idle_s
        stats["async/rollouts_lost_worker_died"] = float(self.counters.rollouts_lost_worker_died)
        stats["async/newest_generator_version"] = float(self.newest_delivered)
        self.fresh, self.fresh_stats = [], defaultdict(list)
        return stats

    def save_clocks(self) -> None:
        self.counters.roles = {k: v.as_dict() for k, v in sorted(self.clocks.items())}

    def checkpoint(self) -> Path:
        self.save_clocks()
        return super().checkpoint()


def run_async(s: AsyncSession) -> dict[str, Any]:
    """Ingest deliveries -> (if a batch is ready within the bounds) sample -> update ->
    publish weights every k steps, until `train.steps`; generators never wait on the learner
    except through the pacing holds."""
    cfg, c = s.cfg, s.counters
    B = cfg.batch_size
    # the pool before the starting policy's evaluation: a runtime whose learners hold no
    # whole policy evaluates on a generator (ray_runtime.py); no generator runs yet
    pool = s.pool = s.pool_factory(s)
    pool.publish(s.model, s.learner.version)
    s.start()
    s.log(
        f"runtime {cfg.runtime}: {cfg.workers.generators} generator worker(s), weights "
        f"synced every {cfg.workers.sync_every} step(s), staleness bound "
        f"{cfg.workers.max_staleness} ({cfg.workers.on_stale}), replay ratio {s.ratio}"
    )
    progress = Progress(cfg.train.steps, c.step, cfg.logging.progress)
    stopped, signum = False, 0
    try:
        pool.start()
        s.write_pids()
        with StopOnSignal() as stop:
            _learn_while_generating(s, pool, B, progress, stop)
            stopped, signum = s.stopping(stop), stop.signum
    finally:
        s.ingest(pool.stop())  # everything delivered lands in the buffer
        s.save_clocks()
    if stopped:
        s.interrupted(progress, signum)
    progress.close()
    return s.finish()


def _learn_while_generating(
    s: AsyncSession, pool: GeneratorPool, B: int, progress: Progress, stop: StopOnSignal
) -> None:
    cfg, c = s.cfg, s.counters
    loop_t0, wall0, eval0 = time.perf_counter(), c.wall_seconds, c.eval_seconds
    waited_since = time.perf_counter()
    while c.step < cfg.train.steps and not s.stopping(stop):
        restarts = sum(pool.restarts().values())
        s.ingest(pool.poll() + pool.check())
        if sum(pool.restarts().values()) != restarts:
            s.write_pids()
        pool.set_hold(s.hold(B))
        if not s.ready(B):
            time.sleep(_IDLE_SLEEP_S)
            continue
        t0 = time.perf_counter()
        s.learner_clock.idle_s += t0 - waited_since
        with s.out_of_memory_as_failure():
            s.learner_step(B)
        s.learner_clock.busy_s += time.perf_counter() - t0
        if s.learner.version % cfg.workers.sync_every == 0:
            pool.publish(s.model, s.learner.version)
        c.wall_seconds = wall0 + time.perf_counter() - loop_t0 - (c.eval_seconds - eval0)
        s.end_step(s.step_stats(), progress)
        waited_since = time.perf_counter()
