"""The asynchronous system of experience replay (arXiv 2604.08706, Section 2) as a
discrete-event model: W generators and T data-parallel learners around one FIFO buffer.

It follows the asynchronous loop's rules (`replayrl.run.loops.asynchronous`):

- a generator takes the newest published weights when it starts a batch (paying the weight
  load), generates R rollouts, and delivers them tagged with the version it held;
- the learner takes a step when the buffer holds B usable rollouts, when the replay-ratio pace
  allows it (rollouts sampled + B <= y x rollouts pushed, replay buffers only), and, with
  `on_stale: wait`, when a delivery is at most `max_staleness` versions behind;
- generators hold while they are a batch ahead of what the learner can use, or while
  `max_pending_batches` of their deliveries wait to be read;
- the learner reads deliveries and re-decides the hold only between its steps (and once right
  after taking a batch), as the real loop does: while it trains, deliveries wait in the spool;
- rollouts more than `max_staleness` versions old are dropped at sampling time;
- weights are published every `sync_every` learner steps.

Time is in seconds of the roles' own clocks; the model knows no contention between roles for
one machine's cores (on a shared CPU, measure g and l with the roles running together).
SimPy (a maintained process-based discrete-event library) runs the event loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np
import simpy

from replayrl.design.theory import gamma as paper_gamma


@dataclass(frozen=True)
class SystemSpec:
    """What the model needs of a run: roles, sizes, costs and pacing.

    gen_seconds: one generator's seconds per rollout (a batch of R takes R x this);
    learn_seconds: one learner's seconds per trained rollout (per pass over it);
    *_spread: coefficient of variation of a batch's / a step's time (lognormal);
    sync_seconds: a generator's weight load; step_overhead_seconds: the learner's fixed time
        per step besides training (publishing weights, metrics);
    capacity: FIFO size N; None is the on-policy queue (each rollout trained once, freshest
        first, removed when taken).
    """

    generators: int
    learners: int
    rollouts_per_batch: int
    batch_size: int
    gen_seconds: float
    learn_seconds: float
    capacity: int | None = None
    gen_spread: float = 0.0
    learn_spread: float = 0.0
    epochs: int = 1
    sync_seconds: float = 0.0
    step_overhead_seconds: float = 0.0
    sync_every: int = 1
    replay_ratio: float | None = None
    max_staleness: int | None = None
    wait_on_stale: bool = False
    max_pending_batches: int = 4
    steps: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("generators", "learners", "rollouts_per_batch", "batch_size", "epochs")
        # max_pending_batches=0 would hold every generator forever: the event queue empties
        for name in (*positive, "sync_every", "steps", "max_pending_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        # `not x >= 0` and isfinite: NaN passes every comparison's negation otherwise
        for name in ("gen_seconds", "learn_seconds"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        for name in ("gen_spread", "learn_spread", "sync_seconds", "step_overhead_seconds"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if self.capacity is not None and self.capacity < self.batch_size:
            raise ValueError(
                f"capacity N={self.capacity} is below the batch B={self.batch_size}: "
                "no step could ever be served"
            )
        if self.replay_ratio is not None and not (
            self.replay_ratio > 0 and math.isfinite(self.replay_ratio)
        ):
            raise ValueError(f"replay_ratio must be positive, got {self.replay_ratio}")

    @property
    def mu(self) -> float:
        """Generation vs training cost per rollout (the paper's mu)."""
        return self.gen_seconds / self.learn_seconds


@dataclass
class SimResult:
    """What one simulated run measured."""

    spec: SystemSpec
    wall_seconds: float
    steps: int
    trained: int  # rollouts trained (with repeats across steps; x epochs not counted)
    generated: int
    dropped_stale: int
    generator_idle_share: float  # neither generating nor loading weights (held, or waiting)
    learner_idle_share: float
    generator_sync_share: float  # loading weights
    ages: list[int] = field(repr=False)  # learner version - rollout version, every trained one
    step_ages: list[float] = field(repr=False)  # the mean age of each step's batch

    @property
    def seconds_per_step(self) -> float:
        return self.wall_seconds / self.steps

    @property
    def trained_per_second(self) -> float:
        return self.trained / self.wall_seconds

    @property
    def generated_per_second(self) -> float:
        return self.generated / self.wall_seconds

    @property
    def gamma(self) -> float:
        """Measured compute per trained rollout relative to on-policy: every role's seconds
        (busy or idle: a held GPU costs) over trained rollouts, over g + l."""
        s = self.spec
        spent = (s.generators + s.learners) * self.wall_seconds
        return spent / max(self.trained, 1) / (s.gen_seconds + s.learn_seconds)

    @property
    def effective_x(self) -> float:
        """Staleness horizon x = N / R, with R the rollouts generated per learner step."""
        r = self.generated / self.steps
        n = self.spec.capacity if self.spec.capacity is not None else self.spec.batch_size
        return n / r if r else math.inf

    @property
    def effective_y(self) -> float:
        """Replay ratio y = B / R: average uses of a generated rollout."""
        return self.trained / self.generated if self.generated else math.inf

    def age_quantiles(self) -> dict[str, float]:
        return _quantiles(self.ages)

    def summary(self) -> dict[str, object]:
        s = self.spec
        return {
            "spec": asdict(s),
            "mu": s.mu,
            "seconds_per_step": self.seconds_per_step,
            "trained_per_second": self.trained_per_second,
            "generated_per_second": self.generated_per_second,
            "generator_idle_share": self.generator_idle_share,
            "generator_sync_share": self.generator_sync_share,
            "learner_idle_share": self.learner_idle_share,
            "age": self.age_quantiles(),
            "age_mean": float(np.mean(self.ages)) if self.ages else 0.0,
            "step_age": _quantiles(self.step_ages),
            "dropped_stale": self.dropped_stale,
            "gamma": self.gamma,
            "gamma_paper": paper_gamma(s.mu, s.generators, s.learners),
            "effective_x": self.effective_x,
            "effective_y": self.effective_y,
        }


def _quantiles(values: list[int] | list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.quantile(a, q / 100)) if a.size else 0.0 for q in (50, 90, 100)}


def _lognormal(rng: np.random.Generator, mean: float, cv: float) -> float:
    """A positive duration with this mean and coefficient of variation."""
    if cv <= 0:
        return mean
    sigma2 = math.log(1 + cv * cv)
    return float(mean * rng.lognormal(-sigma2 / 2, math.sqrt(sigma2)))


class _System:
    def __init__(self, spec: SystemSpec) -> None:
        self.spec = spec
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(spec.seed)
        self.buffer: deque[int] = deque()  # each stored rollout's policy version, oldest first
        self.spool: list[tuple[int, int]] = []  # delivered, not yet read: (worker, version)
        self.hold_flag = False
        self.version = 0  # the learner's
        self.published = 0
        self.pushed_usable = 0  # pushed minus dropped as stale (the pace counts these)
        self.sampled = 0
        self.generated = 0
        self.dropped_stale = 0
        self.newest_delivered = -1
        self.steps = 0
        self.ages: list[int] = []
        self.step_ages: list[float] = []
        self.gen_busy = 0.0  # generating (weight loads apart: gen_sync)
        self.gen_sync = 0.0
        self.gen_started: dict[int, float] = {}
        self.deliveries_since_step = 0
        # deliveries without a learner step after which the system is declared stuck
        self.stall_limit = 100 * (spec.generators + spec.batch_size // spec.rollouts_per_batch)
        self.stalled = False
        self.learn_busy = 0.0
        self.changed = self.env.event()  # fired whenever the buffer or a version moves
        self.done = self.env.event()

    # -- the asynchronous loop's rules ------------------------------------------------------
    def _drop_stale(self) -> None:
        bound = self.spec.max_staleness
        if bound is None:
            return
        while self.buffer and self.buffer[0] < self.version - bound:
            self.buffer.popleft()
            self.dropped_stale += 1
            self.pushed_usable -= 1
        if self.spec.capacity is None:  # the on-policy queue is freshest-first, not sorted
            keep = [v for v in self.buffer if v >= self.version - bound]
            self.dropped_stale += len(self.buffer) - len(keep)
            self.pushed_usable -= len(self.buffer) - len(keep)
            self.buffer = deque(keep)

    def _usable(self) -> bool:
        s, B = self.spec, self.spec.batch_size
        self._drop_stale()
        if len(self.buffer) < B:
            return False
        if s.wait_on_stale and s.max_staleness is not None:
            if self.newest_delivered < self.version - s.max_staleness:
                return False
        return True

    def ready(self) -> bool:
        s = self.spec
        if not self._usable():
            return False
        if s.capacity is not None and s.replay_ratio is not None:
            return self.sampled + s.batch_size <= s.replay_ratio * self.pushed_usable
        return True

    def hold(self) -> bool:
        s = self.spec
        if s.capacity is None:
            return len(self.buffer) >= s.batch_size
        if s.replay_ratio is None or not self._usable():
            return False
        need = (self.sampled + s.batch_size) / s.replay_ratio + s.rollouts_per_batch
        return self.pushed_usable >= need

    def _set_hold(self) -> None:
        hold = self.hold()
        if hold != self.hold_flag:
            self.hold_flag = hold
            self._notify()

    def _notify(self) -> None:
        old, self.changed = self.changed, self.env.event()
        old.succeed()

    # -- roles ------------------------------------------------------------------------------
    def ingest(self) -> None:
        s = self.spec
        for _, version in self.spool:
            self.buffer.extend([version] * s.rollouts_per_batch)
            self.pushed_usable += s.rollouts_per_batch
            if s.capacity is not None:
                while len(self.buffer) > s.capacity:
                    self.buffer.popleft()  # evicted rollouts were usable: the pace keeps them
            self.newest_delivered = max(self.newest_delivered, version)
        if self.spool:
            self.spool = []
            self._notify()

    def generator(self, worker: int):
        s, env = self.spec, self.env
        held = -1  # no weights yet: the learner publishes version 0 at the start
        while not self.done.triggered:
            pending = sum(1 for w, _ in self.spool if w == worker)
            if self.hold_flag or pending >= s.max_pending_batches:
                yield self.changed | self.done
                continue
            if held != self.published:
                held = self.published
                yield env.timeout(s.sync_seconds)
                self.gen_sync += s.sync_seconds
            t = _lognormal(self.rng, s.gen_seconds * s.rollouts_per_batch, s.gen_spread)
            self.gen_started[worker] = env.now  # busy until delivered (or the run ends)
            yield env.timeout(t)
            del self.gen_started[worker]
            self.gen_busy += t
            if self.done.triggered:
                break
            self.generated += s.rollouts_per_batch
            self.spool.append((worker, held))
            self.deliveries_since_step += 1
            if self.deliveries_since_step > self.stall_limit:  # e.g. every delivery too stale
                self.stalled = True
                self.done.succeed()
                break
            self._notify()

    def learner(self):
        s, env = self.spec, self.env
        while self.steps < s.steps:
            self.ingest()
            self._set_hold()
            if not self.ready():
                self._set_hold()  # ready() may have dropped stale rollouts: re-decide
                yield self.changed
                continue
            batch = self._take()
            self.sampled += len(batch)
            self._set_hold()
            ages = [self.version - v for v in batch]
            self.ages += ages
            self.step_ages.append(sum(ages) / len(ages))
            per_learner = s.batch_size * s.epochs * s.learn_seconds / s.learners
            # data-parallel learners wait for the slowest at the all-reduce
            t = max(_lognormal(self.rng, per_learner, s.learn_spread) for _ in range(s.learners))
            yield env.timeout(t + s.step_overhead_seconds)
            self.learn_busy += t + s.step_overhead_seconds
            self.version += 1
            self.steps += 1
            self.deliveries_since_step = 0
            if self.version % s.sync_every == 0:
                self.published = self.version
            self._notify()
        self.done.succeed()

    def _take(self) -> list[int]:
        s = self.spec
        if s.capacity is None:  # freshest first, removed
            return [self.buffer.pop() for _ in range(s.batch_size)]
        # uniform, B distinct rollouts, none removed (the replay buffer's sample)
        idx = self.rng.choice(len(self.buffer), size=s.batch_size, replace=False)
        items = list(self.buffer)
        return [items[i] for i in idx]


def simulate(spec: SystemSpec) -> SimResult:
    """Run the model until the learner has taken `spec.steps` steps."""
    system = _System(spec)
    env = system.env
    for worker in range(spec.generators):
        env.process(system.generator(worker))
    env.process(system.learner())
    env.run(until=system.done)
    if system.stalled:
        raise ValueError(
            f"the learner took no step after {system.stall_limit} deliveries (at step "
            f"{system.steps}): with these bounds it can never be served (e.g. every delivery "
            "is older than max_staleness allows, or N and the pace rule out a batch)"
        )
    wall = float(env.now)
    gen_busy = system.gen_busy + sum(wall - t0 for t0 in system.gen_started.values())
    gen_total = spec.generators * wall
    return SimResult(
        spec=spec,
        wall_seconds=wall,
        steps=system.steps,
        trained=system.sampled,
        generated=system.generated,
        dropped_stale=system.dropped_stale,
        generator_idle_share=1 - (gen_busy + system.gen_sync) / gen_total if gen_total else 0.0,
        generator_sync_share=system.gen_sync / gen_total if gen_total else 0.0,
        learner_idle_share=1 - system.learn_busy / wall if wall else 0.0,
        ages=system.ages,
        step_ages=system.step_ages,
    )
