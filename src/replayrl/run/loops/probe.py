"""`design.alpha` / `design.rho` = measured: the warm-up probe that measures them.

The `auto` warm-up (run/loops/auto.py: auto_design) generates `design.warmup_steps` batches to
time mu. To see staleness it also needs policy updates, so when alpha or rho is `measured` the
warm-up takes one on-policy update after each of its batches (the run's own loss; the learning
rate of the schedule's first steps after its LR warm-up, `probe_lr_steps`; a separate shuffle
generator). Before each update, and once more at the last policy, it generates
`design.probe_batches` batches that are only measured, never trained on, and computes at the
last policy the per-sample gradients of those: staleness W, W-1, ..., 1 and 0 for W warm-up
steps (learner/grad_probe.py). alpha and rho come from design/staleness.py.

Why separate batches (our choice; the paper does not say how to measure): one update on a
batch shrinks that batch's own per-sample gradients on our reasoning tasks (mean squared norm
0.02-0.83x, median 0.13x over 23 updates, that of batches of the same policy it did not train
on: benchmarks/probe_batches.py, output in benchmarks/results/heldout/probe_batches/), so
measuring the batch an update was taken on reads "already trained on" as "stale" and the
spread as falling with staleness. Paper 1's sigma(x) is the error of a rollout of an earlier
policy, whatever the learner did with it.

Then the weights, optimizer and learner state are put back exactly as they were: the run
starts from the same policy as without the probe, and its buffer holds only the first warm-up
batch (version 0, on-policy for that policy); the later warm-up batches came from policies
that no longer exist, and the measured batches are not kept either (those of version 0 would
be on-policy, but keeping them would start the run with more fresh rollouts than R): all are
counted as generated, and in the ledger's `discarded_probe`.

Ill-conditioned (fewer than two warm-up steps: staleness 0, 1, 2 are the minimum; advantages
from a critic; a probe update whose learning rate is 0; too few prompt groups; no gradient
signal): the configured fallback values are used and the log says so and why.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from replayrl.config.schema import DESIGN_FALLBACK, Config
from replayrl.data.rollout_record import Rollout
from replayrl.design.staleness import (
    MIN_LEVELS,
    AlphaRhoEstimate,
    bootstrap_alpha_rho,
    estimate_alpha_rho,
)
from replayrl.learner.grad_probe import sample_gradients
from replayrl.learner.lr_schedule import lr_multiplier, warmup_steps
from replayrl.run.loops.steps import produce_fresh, push_engine_weights
from replayrl.run.session import Session

MEASURED = "measured"


def measured_keys(cfg: Config) -> list[str]:
    """Which of alpha, rho the config asks to measure."""
    return [k for k in ("alpha", "rho") if getattr(cfg.design, k) == MEASURED]


def lr_warmup(cfg: Config) -> int:
    """The run's learning-rate warm-up in steps (train.warmup_steps / warmup_ratio)."""
    t = cfg.train
    return warmup_steps(t.steps, t.warmup_steps, t.warmup_ratio)


def probe_lr_steps(cfg: Config) -> list[int]:
    """The schedule steps (1-based) the probe's `design.warmup_steps` updates take their
    learning rate from: the first ones after the run's LR warm-up, warm-up + 1, warm-up + 2, ...
    (1, 2, ... without one). Inside a warm-up the first update would have learning rate 0 and
    staleness 0 and 1 would share one policy. Not specified: our choice."""
    return [lr_warmup(cfg) + k for k in range(1, cfg.design.warmup_steps + 1)]


def probe_blocker(cfg: Config, advantage_at_generation: bool) -> str | None:
    """Why the warm-up cannot measure alpha and rho at all, or None."""
    if cfg.design.warmup_steps < MIN_LEVELS - 1:
        return (
            f"design.warmup_steps = {cfg.design.warmup_steps} gives staleness 0 .. "
            f"{cfg.design.warmup_steps}; the fit needs 0 .. {MIN_LEVELS - 1} "
            f"(design.warmup_steps >= {MIN_LEVELS - 1})"
        )
    if not advantage_at_generation:
        return "per-sample gradients need advantages stored at generation (grpo, rloo), not gae"
    t, warm = cfg.train, lr_warmup(cfg)
    for step in probe_lr_steps(cfg):
        if lr_multiplier(t.lr_scheduler, step - 1, t.steps, warm) <= 0:
            return (
                f"the learning rate of the probe's update at schedule step {step} is 0 "
                f"(train.lr_scheduler = {t.lr_scheduler}, {t.steps} steps, LR warm-up {warm}): "
                "two staleness levels would share one policy"
            )
    return None


@dataclass
class WarmupProbe:
    """The warm-up's policy updates, on the learner's real weights, undone by `finish`."""

    s: Session
    model_state: dict[str, torch.Tensor] = field(init=False)
    learner_state: dict[str, object] = field(init=False)
    updates: int = 0  # on-policy updates taken (each makes every measured batch 1 staler)
    measured: list[list[Rollout]] = field(default_factory=list)  # never trained on
    seconds: float = 0.0
    measured_rollouts: int = 0  # generated for measurement only, never kept
    # bootstrap re-estimates of (alpha, rho) on the same gradients (None: ill-conditioned)
    draws: list[tuple[float, float] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        model = self.s.learner.model
        self.model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.learner_state = copy.deepcopy(self.s.learner.state_dict())
        self.rng = np.random.default_rng(self.s.cfg.train.seed + 7919)  # not the run's
        self.lr_warmup = lr_warmup(self.s.cfg)  # updates at the LR after it (probe_lr_steps)

    def update(self, rollouts: list[Rollout]) -> None:
        """Measure batches of the current policy, then take one on-policy update on a warm-up
        batch of that policy (its policy version is the staleness key)."""
        self._measure()
        t0 = time.perf_counter()
        learner = self.s.learner
        self.updates += 1
        if rollouts:
            learner.train_step(rollouts, self.rng, step=self.lr_warmup + self.updates)
        else:
            learner.version += 1
        self._sync_generator()
        self.seconds += time.perf_counter() - t0

    def _measure(self) -> None:
        """`design.probe_batches` batches of the current policy, kept only for the gradients;
        their generation counts as the run's generation time (less reward time)."""
        s = self.s
        for _ in range(s.cfg.design.probe_batches):
            t0 = time.perf_counter()
            batch, stats = produce_fresh(s.producer, s.source, s.counters, s.learner.version)
            s.counters.generation_seconds += max(
                time.perf_counter() - t0 - stats.get("time/reward_s", 0.0), 0.0
            )
            self.measured.append(batch)
            self.measured_rollouts += len(batch)

    def finish(self) -> AlphaRhoEstimate:
        """Measure batches of the last policy, take per-sample gradients of every measured
        batch at it, estimate alpha and rho; restore the policy and learner either way."""
        s = self.s
        try:
            self._measure()
            t1 = time.perf_counter()
            tagged = [(i, r) for i, batch in enumerate(self.measured) for r in batch]
            rows = [r for _, r in tagged]
            if not rows:  # every measured rollout dropped (too long, reward errors)
                return AlphaRhoEstimate(
                    None, None, reason="every measured batch came back empty (no rollouts)"
                )
            version = s.learner.version
            grads = sample_gradients(s.learner, rows, seed=s.cfg.train.seed)
            staleness = np.array([version - r.policy_version for r in rows])
            # one prompt's group within one batch (batches reuse group ids 0 ..): one cluster
            # per distinct (batch, group id) pair
            pairs = np.array([(i, r.group_id) for i, r in tagged]).reshape(-1, 2)
            clusters = np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)
            est = estimate_alpha_rho(grads, staleness, clusters)
            # how sure: the design checks its saving on each draw (alpha = rho = 0 falls back)
            if est.ok and not (est.alpha == 0.0 and est.rho == 0.0):
                boot = bootstrap_alpha_rho(
                    grads, staleness, clusters, s.cfg.design.bootstrap, seed=s.cfg.train.seed
                )
                self.draws = [(b.alpha, b.rho) if b.ok else None for b in boot]  # type: ignore[misc]
            self.seconds += time.perf_counter() - t1
            return est
        finally:
            self.restore()

    def restore(self) -> None:
        learner = self.s.learner
        learner.model.load_state_dict(self.model_state)
        learner.load_state_dict(self.learner_state)
        learner.optimizer.zero_grad(set_to_none=True)
        self._sync_generator()

    def _sync_generator(self) -> None:
        push_engine_weights(self.s.engine, self.s.learner)


def resolve_alpha_rho(
    cfg: Config, est: AlphaRhoEstimate | None, why_not: str | None
) -> tuple[float, float, dict[str, Any], str | None]:
    """(alpha, rho, record fields, fallback log line or None) from the config and a probe."""
    d, keys = cfg.design, measured_keys(cfg)
    if est is not None and est.ok and not (est.alpha == 0.0 and est.rho == 0.0):
        got = {"alpha": est.alpha, "rho": est.rho}
        why = None
    else:
        got = {}
        why = why_not or (est.reason if est is not None and not est.ok else None)
        why = why or "measured alpha = rho = 0: the design has no finite optimum"
    values: dict[str, float] = {}
    record: dict[str, Any] = {}
    for k in ("alpha", "rho"):
        configured = getattr(d, k)
        if k not in keys:
            values[k], record[f"{k}_source"] = float(configured), "config"
        elif k in got:
            values[k], record[f"{k}_source"] = float(got[k]), MEASURED  # type: ignore[arg-type]
        else:
            values[k], record[f"{k}_source"] = DESIGN_FALLBACK[k], "fallback"
    line = None
    if keys and not got:
        shown = ", ".join(f"{k} = {DESIGN_FALLBACK[k]:g}" for k in keys)
        line = f"auto design: {' and '.join(keys)} not measured ({why}); using {shown} (fallback)"
        record["measure_failed"] = why
    if est is not None:
        record["staleness_horizons"] = list(est.horizons)
        record["staleness_sigma2"] = list(est.sigma2)
        record["probe_samples"] = est.samples
    return values["alpha"], values["rho"], record, line
