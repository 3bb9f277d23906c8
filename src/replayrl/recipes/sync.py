"""The synchronous loop: generate R rollouts -> score -> advantages -> push -> sample B -> update.

Producer (generator + scorer) -> batch source -> learner in every mode: the on-policy
baseline is a buffer that hands out the freshest rollouts and removes them, replay samples a
FIFO, ReMix mixes fresh rollouts with a window of recent policies'; only the batch source and
the loss change, never this loop.
"""

from __future__ import annotations

import time
from typing import Any

from replayrl.config.schema import Config
from replayrl.data.design import cost_ratio, estimate_mu
from replayrl.data.rollout import Rollout
from replayrl.run.metrics import Progress
from replayrl.run.session import Session, StopOnSignal


def run_sync(s: Session) -> dict[str, Any]:
    """Train for `train.steps` steps (from a resumed step on), then evaluate and summarise."""
    if s.source is None:  # buffer.capacity / train.batch_size = auto
        cfg, warmup, design = auto_design(s)
        s.adopt_design(cfg, warmup, design)
    s.start()
    c = s.counters
    progress = Progress(s.cfg.train.steps, c.step, s.cfg.logging.progress)
    with StopOnSignal() as stop:
        # a Python API callback may stop early: the run still finishes (eval, checkpoint)
        while c.step < s.cfg.train.steps and not s.hooks.stop_requested:
            sync_step(s, progress)
            if stop.requested:
                s.interrupted(progress, stop.signum)  # between steps: the checkpoint is exact
    progress.close()
    return s.finish()


def sync_step(s: Session, progress: Progress) -> None:
    """One step of the algorithm, timed: generation + scoring, then one learner step."""
    assert s.source is not None
    c = s.counters
    s.source.before_step(s.learner, c, s.log)  # ReMix: reincarnation at step T
    t_start = time.perf_counter()
    fresh, stats = s.produce()  # generate, score, group advantages
    t_reward = stats.get("time/reward_s", 0.0)  # user code, not generation: not in mu
    t_gen = time.perf_counter() - t_start - t_reward
    s.watch_signal(fresh, stats, c.step + 1)  # before ReMix / buffer sampling: fresh only
    batch, epochs = s.source.next_batch(fresh, s.learner.version)  # push, sample
    t_train = s.train_batch(batch, epochs, fresh, stats)  # update
    c.generation_seconds += t_gen
    mu = cost_ratio(t_gen, len(fresh), t_train, len(batch) * epochs)
    if mu is not None:  # a step that generated or trained nothing measures nothing
        c.mu_per_step.append(mu)
    stats["time/generation_s"] = t_gen
    c.wall_seconds += time.perf_counter() - t_start
    s.end_step(stats, progress)


def auto_design(s: Session) -> tuple[Config, list[Rollout], dict[str, float]]:
    """Resolve `auto` N / B: measure mu on warm-up batches, then apply paper 1's optimum.

    Returns the resolved config (the session's own is not changed), the warm-up rollouts
    (real, version 0: they go into the buffer) and the design record. The training passes
    used for timing take no optimizer step.
    """
    from replayrl.data.design import feasible_design

    cfg, R = s.cfg, s.cfg.rollouts_per_step
    mus, produced = [], []
    for _ in range(cfg.design.warmup_steps):
        t0 = time.perf_counter()
        rollouts, stats = s.produce()
        t_gen = time.perf_counter() - t0 - stats.get("time/reward_s", 0.0)  # not rewards
        produced.extend(rollouts)
        if not rollouts:
            continue
        t1 = time.perf_counter()
        s.learner.measure_backward(rollouts)
        t_train = time.perf_counter() - t1
        mu = cost_ratio(t_gen, len(rollouts), t_train, len(rollouts))
        if mu is not None:
            mus.append(mu)
        s.counters.generation_seconds += t_gen
    mu = estimate_mu(mus)
    if mu is None:
        raise ValueError("auto design: every warm-up rollout was dropped; cannot measure mu")
    d = cfg.design
    # alpha and rho are the config's (defaults 0.25, 0.5), not measured: the warm-up takes no
    # optimizer step, so it has no stale rollouts to measure sigma^2(x) on
    rep = feasible_design(mu, d.alpha, d.rho, R, d.allow_y_below_one, d.min_saving)
    new = resolve_design(cfg, rep.N, rep.B)
    s.log(
        f"auto design: measured mu = {mu:.3g}, alpha = {d.alpha:g}, rho = {d.rho:g} (config) -> "
        f"{rep.reason} -> buffer.capacity N = {new.buffer.capacity}, train.batch_size B = "
        f"{new.batch_size} (R = {R})"
    )
    record = {
        "mu": mu,
        "alpha": d.alpha,
        "rho": d.rho,
        "x_star": rep.x_unconstrained,
        "y_star": rep.y_unconstrained,
        "x": rep.x,
        "y": rep.y,
        "on_policy": rep.on_policy,
        "predicted_saving": rep.saving,
        "N": new.buffer.capacity,
        "B": new.batch_size,
    }
    return new, produced, record  # type: ignore[return-value]


def resolve_design(cfg: Config, N: int, B: int) -> Config:
    """A copy of `cfg` with `auto` capacity / batch size replaced by N / B."""
    new = cfg.model_copy(deep=True)
    if new.buffer.capacity == "auto":
        new.buffer.capacity = N
    if new.train.batch_size == "auto":
        new.train.batch_size = B
    if new.batch_size > new.buffer.capacity and not new.buffer.with_replacement:  # type: ignore[operator]
        new.buffer.with_replacement = True  # the theory's sampling model when B > N
    return new
