"""`auto` buffer size and replay ratio (experimental): measure mu (and alpha, rho) on the
run's own warm-up, then apply the feasible optimum of arXiv 2604.08706's cost model.

The closed form and the feasible design themselves are `design.theory` (what `replayrl
design` prints); this module is the warm-up that feeds them measured values. By the project's
own benchmarks the warm-up rarely measures alpha on small batches and the run then stays
on-policy: treat it as an experiment.
"""

from __future__ import annotations

import time
from typing import Any

from replayrl.config.schema import Config
from replayrl.data.rollout_record import Rollout
from replayrl.design.theory import (
    FeasibleDesign,
    cost_ratio,
    design_confidence,
    estimate_mu,
    feasible_design,
    on_policy_design,
)
from replayrl.run.loops.probe import (
    MEASURED,
    WarmupProbe,
    measured_keys,
    probe_blocker,
    resolve_alpha_rho,
)
from replayrl.run.loops.steps import produce_fresh
from replayrl.run.session import Session


def auto_design(s: Session) -> tuple[Config, list[Rollout], dict[str, Any]]:
    """Resolve `auto` N / B: measure mu (and `measured` alpha, rho) on warm-up batches, then
    apply paper 1's feasible optimum.

    Returns the resolved config (the session's own is not changed), the warm-up rollouts
    (real, version 0: they go into the buffer) and the design record. The training passes
    used for timing take no optimizer step; the alpha / rho probe's updates are undone
    (run/loops/probe.py).
    """
    cfg, R = s.cfg, s.cfg.rollouts_per_step
    probe, why_not = _start_probe(s)
    mus, produced = _warmup(s, probe)
    measured_mu = estimate_mu(mus)
    mu_source = MEASURED if cfg.design.mu == MEASURED else "config"
    mu = measured_mu if mu_source == MEASURED else float(cfg.design.mu)
    if mu is None or not produced:  # a given mu still needs rollouts: the probe, the buffer
        why = "cannot measure mu" if mu_source == MEASURED else "nothing to start from"
        raise ValueError(f"auto design: every warm-up rollout was dropped; {why}")
    est = probe.finish() if probe is not None else None
    alpha, rho, how, fallback = resolve_alpha_rho(cfg, est, why_not)
    if fallback:
        s.log(fallback)
    if probe is not None:
        kept = [r for r in produced if r.policy_version == 0]
        # later warm-up batches came from its undone policies; measured ones are never kept
        not_kept = len(produced) - len(kept) + probe.measured_rollouts
        s.counters.rollouts_discarded_probe += not_kept  # a ledger term: generated, not kept
        how.update(probe_seconds=probe.seconds, probe_rollouts_not_kept=not_kept)
        produced = kept
    d = cfg.design
    # x <= the run's steps: a buffer larger than all the run generates is never filled
    x_max = max(float(cfg.train.steps), 1.0 + 1e-9)
    rep = feasible_design(
        mu,
        alpha,
        rho,
        R,
        d.allow_y_below_one,
        d.min_saving,
        x_max=x_max,
        allow_b_above_n=d.allow_b_above_n,
    )
    if fallback and not rep.on_policy and not d.reuse_on_fallback:
        how["fallback_saving"] = rep.saving
        rep = on_policy_design(
            rep,
            R,
            f"stay on-policy: alpha / rho were not measured, and the design on the fallback "
            f"values (x = {rep.x:.3g}, y = {rep.y:.3g}, predicted saving {rep.saving:.1%}) "
            "rests on guesses (design.reuse_on_fallback=true uses it)",
        )
    if probe is not None and not fallback and not rep.on_policy and d.confidence > 0:
        rep = _confident_or_on_policy(cfg, rep, mu, probe.draws, how)
    new = resolve_design(cfg, rep.N, rep.B)
    s.log(
        f"auto design: mu = {mu:.3g} ({_mu_how(mu_source, measured_mu)}), "
        f"alpha = {alpha:.3g} ({how['alpha_source']}), "
        f"rho = {rho:.3g} ({how['rho_source']}) -> {rep.reason} -> buffer.capacity N = "
        f"{new.buffer.capacity}, train.batch_size B = {new.batch_size} (R = {R})"
    )
    record = {
        "mu": mu,
        "mu_source": mu_source,
        "mu_measured": measured_mu,
        "alpha": alpha,
        "rho": rho,
        "x_star": rep.x_unconstrained,
        "y_star": rep.y_unconstrained,
        "x": rep.x,
        "y": rep.y,
        "on_policy": rep.on_policy,
        "predicted_saving": rep.saving,
        "N": new.buffer.capacity,
        "B": new.batch_size,
        **how,
    }
    return new, produced, record


def _confident_or_on_policy(
    cfg: Config,
    rep: FeasibleDesign,
    mu: float,
    draws: list[tuple[float, float] | None],
    how: dict[str, Any],
) -> FeasibleDesign:
    """`rep` when its saving survives the warm-up's sampling noise (design.confidence of the
    bootstrap draws predict >= design.min_saving for its x, y), else on-policy, with why."""
    d = cfg.design
    # a key the config gives as a number stays that number in every draw
    fixed = {k: float(getattr(d, k)) for k in ("alpha", "rho") if k not in measured_keys(cfg)}
    draws = [
        None if dr is None else (fixed.get("alpha", dr[0]), fixed.get("rho", dr[1])) for dr in draws
    ]
    conf = design_confidence(rep.x, rep.y, mu, draws, d.min_saving)
    failed = sum(dr is None for dr in draws)
    how.update(confidence=conf, confidence_draws=len(draws), confidence_failed_draws=failed)
    if conf >= d.confidence:
        return rep
    how["unconfident_saving"] = rep.saving
    return on_policy_design(
        rep,
        cfg.rollouts_per_step,
        f"stay on-policy: the buffer x = {rep.x:.3g}, y = {rep.y:.3g} is predicted to save "
        f"{rep.saving:.1%} at the measured alpha, rho, but at least {d.min_saving:.3g} in only "
        f"{conf:.0%} of {len(draws)} half-sample re-estimates of the warm-up's gradients "
        f"({failed} of them not estimable: no signal or a falling spread; "
        f"design.confidence = {d.confidence:.3g})",
    )


def _mu_how(source: str, measured: float | None) -> str:
    """How the design's mu was set, for the log: measured here, or given (and what was seen)."""
    if source == MEASURED:
        return "measured"
    return f"design.mu; measured here {measured:.3g}" if measured is not None else "design.mu"


def _start_probe(s: Session) -> tuple[WarmupProbe | None, str | None]:
    """The alpha / rho probe when the config measures either, or why it cannot run."""
    if not measured_keys(s.cfg):
        return None, None
    why = probe_blocker(s.cfg, s.learner.advantage.at_generation)
    return (None, why) if why else (WarmupProbe(s), None)


def _warmup(s: Session, probe: WarmupProbe | None) -> tuple[list[float], list[Rollout]]:
    """`design.warmup_steps` timed batches: per-step mu, and the rollouts produced."""
    mus: list[float] = []
    produced: list[Rollout] = []
    for _ in range(s.cfg.design.warmup_steps):
        t0 = time.perf_counter()
        rollouts, stats = produce_fresh(s.producer, s.source, s.counters, s.learner.version)
        t_gen = time.perf_counter() - t0 - stats.get("time/reward_s", 0.0)  # not rewards
        produced.extend(rollouts)
        if rollouts:
            t1 = time.perf_counter()
            s.learner.measure_backward(rollouts)
            t_train = time.perf_counter() - t1
            mu = cost_ratio(t_gen, len(rollouts), t_train, len(rollouts))
            if mu is not None:
                mus.append(mu)
            s.counters.generation_seconds += t_gen
        if probe is not None:
            probe.update(rollouts)
    return mus, produced


def resolve_design(cfg: Config, N: int, B: int) -> Config:
    """A copy of `cfg` with `auto` capacity / batch size replaced by N / B, and the ratios
    x = N/R, y = B/R set to match (a preset's own x, y would otherwise describe another
    buffer in the saved config, and warn when it is read back)."""
    new = cfg.model_copy(deep=True)
    R = cfg.rollouts_per_step
    if new.buffer.capacity == "auto":
        new.buffer.capacity = N
        new.buffer.staleness_horizon = N / R
    if new.train.batch_size == "auto":
        new.train.batch_size = B
        new.buffer.replay_ratio = B / R
    if new.batch_size > new.buffer.capacity and not new.buffer.with_replacement:  # type: ignore[operator]
        new.buffer.with_replacement = True  # the theory's sampling model when B > N
    return new
