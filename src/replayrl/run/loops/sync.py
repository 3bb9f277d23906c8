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
from replayrl.design.theory import cost_ratio
from replayrl.run.loops.auto import auto_design
from replayrl.run.loops.steps import learn, produce_fresh
from replayrl.run.metrics import Progress
from replayrl.run.session import Session, StopOnSignal


def run_sync(s: Session) -> dict[str, Any]:
    """Train for `train.steps` steps (from a resumed step on), then evaluate and summarise."""
    if s.source is None:  # buffer.capacity / train.batch_size = auto (experimental)
        cfg, warmup, design = auto_design(s)
        s.adopt_design(cfg, warmup, design)
    s.start()
    c = s.counters
    progress = Progress(s.cfg.train.steps, c.step, s.cfg.logging.progress)
    with StopOnSignal() as stop:
        # a Python API callback may stop early: the run still finishes (eval, checkpoint)
        while c.step < s.cfg.train.steps and not s.hooks.stop_requested:
            if budget_spent(s.cfg, c.rollouts_generated):
                s.log(f"train.rollout_budget spent: {c.rollouts_generated} rollouts generated")
                break
            with s.out_of_memory_as_failure():
                sync_step(s, progress)
            if stop.requested:
                s.interrupted(progress, stop.signum)  # between steps: the checkpoint is exact
    progress.close()
    return s.finish()


def budget_spent(cfg: Config, generated: int) -> bool:
    """train.rollout_budget reached (a step never starts past it; the last one may end above
    it by up to one step's rollouts)."""
    budget = cfg.train.rollout_budget
    return budget is not None and generated >= budget


def sync_step(s: Session, progress: Progress) -> None:
    """One step of the algorithm, timed: generation + scoring, then one learner step."""
    assert s.source is not None
    c = s.counters
    s.source.before_step(s.learner, c, s.log)  # ReMix: reincarnation at step T
    t_start = time.perf_counter()
    # generate, score, group advantages
    fresh, stats = produce_fresh(s.producer, s.source, c, s.learner.version)
    t_reward = stats.get("time/reward_s", 0.0)  # user code, not generation: not in mu
    t_gen = time.perf_counter() - t_start - t_reward
    s.watch_signal(fresh, stats, c.step + 1)  # before ReMix / buffer sampling: fresh only
    batch, epochs = s.source.next_batch(fresh, s.learner.version)  # push, sample
    t_train = learn(  # update
        s.learner,
        c,
        batch,
        epochs,
        fresh,
        stats,
        cfg=s.cfg,
        shuffle_rng=s.parts.shuffle_rng,
        check_training=s.check_training,
        completions=s.completions,
        engine=s.engine,
    )
    c.generation_seconds += t_gen
    mu = cost_ratio(t_gen, len(fresh), t_train, len(batch) * epochs)
    if mu is not None:  # a step that generated or trained nothing measures nothing
        c.mu_per_step.append(mu)
    stats["time/generation_s"] = t_gen
    c.wall_seconds += time.perf_counter() - t_start
    s.end_step(stats, progress)
