"""`replayrl simulate`: the asynchronous generator/learner system as a discrete-event model.

    replayrl simulate --generators 7 --learners 1 --batch 128 --capacity 256 \\
        --rollouts-per-batch 64 --mu 5.3 --learn-seconds 0.3 --replay-ratio 2
    replayrl simulate --from-run runs/NAME          # a finished run's own roles, sizes and costs
    replayrl simulate --cluster-table               # paper 1's design at 8-512 GPUs

It prints throughput (trained and generated rollouts per second), each role's idle share, the
staleness distribution (learner version minus rollout version), the measured gamma beside the
paper's gamma = (1 + W/T) / (1 + mu), and the buffer's effective x = N/R and y = B/R. With
`--from-run` it also prints what the run measured, so the model can be checked against it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # the model (and SimPy) load when the command runs, not with the CLI
    from replayrl.design.event_model import SimResult, SystemSpec


def _read_run(run: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    for name in ("config.yaml", "summary.json", "metrics.jsonl"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"--from-run {run}: no {name} (not a finished run folder?)")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return cfg, summary, rows


def spec_from_run(run: Path, steps: int | None = None, seed: int = 0) -> SystemSpec:
    """The model of a finished asynchronous run: its W, T, R, B, N, pacing and bounds from
    config.yaml, and its costs from the roles' clocks in summary.json (generator seconds per
    rollout, learner seconds per trained rollout, the learner's per-step time besides
    training, and the spread of its step times)."""
    from replayrl.design.event_model import SystemSpec

    cfg, summary, rows = _read_run(run)
    roles = (summary.get("accounting") or {}).get("roles") or {}
    gens = [r for k, r in roles.items() if k.startswith("generator")]
    learners = [r for k, r in roles.items() if k.startswith("learner")]
    if not gens or not learners:
        raise ValueError(
            f"--from-run {run}: summary.json has no generator and learner clocks "
            "(only runs of the async-local and ray runtimes have them)"
        )
    w, b, rollout = cfg["workers"], cfg["buffer"], cfg["rollout"]
    r_batch = int(rollout["prompts_per_step"]) * int(rollout["num_generations"])
    batch = int(cfg["train"]["batch_size"] or r_batch)
    n_steps = int(summary["steps"])
    gen_busy = sum(r["busy_s"] for r in gens)
    gen_n = sum(r["rollouts"] for r in gens)
    learn_busy = sum(r["busy_s"] for r in learners) / len(learners)
    learn_n = sum(r["rollouts"] for r in learners) / len(learners)
    learn_idle = sum(r["idle_s"] for r in learners) / len(learners)
    overhead = max(0.0, (float(summary["wall_seconds"]) - learn_busy - learn_idle) / n_steps)
    train_s = [float(r["time/training_s"]) for r in rows if r.get("time/training_s")]
    spread = statistics.pstdev(train_s) / statistics.mean(train_s) if len(train_s) > 1 else 0.0
    ratio = w.get("replay_ratio")
    if ratio == "auto":
        ratio = batch / r_batch
    replay = b["kind"] == "replay"
    epochs = learn_n / max(1, n_steps * batch)
    return SystemSpec(
        generators=int(w["generators"]),
        learners=int(w["learners"]),
        rollouts_per_batch=r_batch,
        batch_size=batch,
        capacity=int(b["capacity"]) if replay else None,
        gen_seconds=gen_busy / gen_n,
        learn_seconds=learn_busy / learn_n,
        learn_spread=spread,
        epochs=max(1, round(epochs)),
        step_overhead_seconds=overhead,
        sync_every=int(w["sync_every"]),
        replay_ratio=float(ratio) if (replay and ratio is not None) else None,
        max_staleness=w.get("max_staleness"),
        wait_on_stale=w.get("on_stale") == "wait",
        max_pending_batches=int(w.get("max_pending_batches", 4)),
        steps=n_steps if steps is None else steps,
        seed=seed,
    )


def measured(run: Path) -> dict[str, float]:
    """What a run measured, in the simulator's terms: seconds per step and the quantiles of
    its steps' mean batch age."""
    _, summary, rows = _read_run(run)
    ages = sorted(float(r["batch/age_mean"]) for r in rows if "batch/age_mean" in r)

    def q(p: float) -> float:
        return statistics.quantiles(ages, n=100, method="inclusive")[round(p) - 1] if ages else 0

    return {
        "seconds_per_step": float(summary["wall_seconds"]) / int(summary["steps"]),
        "step_age_p50": statistics.median(ages) if ages else 0.0,
        "step_age_p90": q(90),
        "step_age_mean": statistics.fmean(ages) if ages else 0.0,
    }


def predicted(spec: SystemSpec, seeds: int = 5) -> dict[str, float]:
    """The model's figures averaged over `seeds` random streams."""
    from replayrl.design.event_model import simulate

    runs = [simulate(_with_seed(spec, spec.seed + i)) for i in range(seeds)]
    out: dict[str, float] = {}
    for key, fn in (
        ("seconds_per_step", lambda r: r.seconds_per_step),
        ("step_age_p50", lambda r: r.summary()["step_age"]["p50"]),
        ("step_age_p90", lambda r: r.summary()["step_age"]["p90"]),
        ("step_age_mean", lambda r: statistics.fmean(r.step_ages)),
    ):
        out[key] = statistics.fmean(fn(r) for r in runs)
    return out


def _with_seed(spec: SystemSpec, seed: int) -> SystemSpec:
    from dataclasses import replace

    return replace(spec, seed=seed)


def format_result(r: SimResult) -> str:
    s, d = r.spec, r.summary()
    age, step_age = d["age"], d["step_age"]
    n = "on-policy queue" if s.capacity is None else f"N={s.capacity}"
    lines = [
        f"system: W={s.generators} generators, T={s.learners} learners, R={s.rollouts_per_batch} "
        f"per delivery, B={s.batch_size}, {n}, y pace={s.replay_ratio}, "
        f"max_staleness={s.max_staleness}, weights every {s.sync_every} step(s)",
        f"costs: g={s.gen_seconds:.4g} s/rollout, l={s.learn_seconds:.4g} s/trained rollout "
        f"(mu={s.mu:.3g}), sync {s.sync_seconds:.3g} s, step overhead "
        f"{s.step_overhead_seconds:.3g} s",
        f"simulated {r.steps} steps in {r.wall_seconds:.1f} s ({r.seconds_per_step:.3f} s/step)",
        f"throughput: {r.trained_per_second:.1f} trained, {r.generated_per_second:.1f} generated "
        "rollouts/s",
        f"idle: generators {100 * r.generator_idle_share:.0f}% (and "
        f"{100 * r.generator_sync_share:.0f}% loading weights), learners "
        f"{100 * r.learner_idle_share:.0f}%",
        f"staleness (learner version - rollout version): p50 {age['p50']:.0f}, p90 "
        f"{age['p90']:.0f}, max {age['p100']:.0f}; per-step mean p50 {step_age['p50']:.2f}; "
        f"dropped as stale {r.dropped_stale}",
        f"gamma: measured {r.gamma:.3f}, paper (1 + W/T) / (1 + mu) = {d['gamma_paper']:.3f}",
        f"buffer: effective x = N/R = {r.effective_x:.2f}, y = B/R = {r.effective_y:.2f}",
    ]
    return "\n".join(lines)


def cluster_table(args: argparse.Namespace) -> str:
    """The replay paper's design at cluster scale, for each of `args.gpus`, `args.mus` and
    `args.syncs`: y* and x* from mu (closed form, `args.alpha`, `args.rho`), W/T = mu / y* so
    that generation keeps pace with training, B = `args.per_learner_batch` x T,
    N = max(B, x* B / y*), and a learner's `args.learn_seconds` per trained rollout."""
    from replayrl.design.event_model import SystemSpec, simulate
    from replayrl.design.theory import design

    out = [
        "| GPUs | mu | sync s | W | T | B | N | s/step | trained/s | gen idle / sync | learn idle "
        "| age p50 / p90 | gamma sim | gamma paper | x eff | y eff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    steps, learn_seconds = 100 if args.steps is None else args.steps, args.learn_seconds
    for mu in args.mus:
        d = design(mu, args.alpha, args.rho)
        for g in args.gpus:
            t = max(1, round(g / (1 + mu / d.y_star)))
            w = g - t
            b = args.per_learner_batch * t
            n = max(b, round(d.x_star * b / d.y_star))
            for sync in args.syncs:
                spec = SystemSpec(
                    generators=w,
                    learners=t,
                    rollouts_per_batch=args.rollouts_per_batch,
                    batch_size=b,
                    capacity=n,
                    gen_seconds=mu * learn_seconds,
                    learn_seconds=learn_seconds,
                    gen_spread=0.2,
                    learn_spread=0.1,
                    sync_seconds=sync,
                    replay_ratio=d.y_star,
                    steps=steps,
                )
                r = simulate(spec)
                s = r.summary()
                out.append(
                    f"| {g} | {mu} | {sync:g} | {w} | {t} | {b} | {n} | "
                    f"{r.seconds_per_step:.2f} | {r.trained_per_second:.0f} | "
                    f"{100 * r.generator_idle_share:.0f}% / {100 * r.generator_sync_share:.0f}% | "
                    f"{100 * r.learner_idle_share:.0f}% | "
                    f"{s['age']['p50']:.0f} / {s['age']['p90']:.0f} | {r.gamma:.2f} | "
                    f"{s['gamma_paper']:.2f} | {r.effective_x:.2f} | {r.effective_y:.2f} |"
                )
    return "\n".join(out)


def cmd_simulate(args: argparse.Namespace) -> int:
    from replayrl.design.event_model import SystemSpec, simulate

    check_args(args)  # by flag name, before the model turns a bad number into a bad answer
    if args.cluster_table:
        print(cluster_table(args))
        return 0
    if args.from_run:
        run = Path(args.from_run)
        spec = spec_from_run(run, steps=args.steps, seed=args.seed)
        print(format_result(simulate(spec)))
        m, p = measured(run), predicted(spec)
        print("model vs run (per-step mean batch age; 5 simulated streams):")
        for key in ("seconds_per_step", "step_age_p50", "step_age_p90", "step_age_mean"):
            gap = (p[key] - m[key]) / m[key] if m[key] else float("nan")
            print(f"  {key:<17} predicted {p[key]:8.3f}  measured {m[key]:8.3f}  gap {gap:+.0%}")
        return 0
    if args.gen_seconds is None and args.mu is None:
        raise ValueError("give --gen-seconds or --mu (with --learn-seconds), or --from-run")
    gen = args.gen_seconds if args.gen_seconds is not None else args.mu * args.learn_seconds
    spec = SystemSpec(
        **{dest: getattr(args, dest) for _, dest, _, _, _ in _SPEC_FLAGS},
        gen_seconds=gen,
        wait_on_stale=args.wait_on_stale,
        steps=200 if args.steps is None else args.steps,
        seed=args.seed,
    )
    result = simulate(spec)
    print(json.dumps(result.summary(), indent=2) if args.json else format_result(result))
    return 0


# what each number may be, by its flag's dest: "count" >= 1, "index" >= 0 (integers);
# "positive" > 0, "nonnegative" >= 0 (finite floats). NaN and inf are never a setting: NaN
# compares false with every bound, so a model fed one runs and prints nan, not an error.
_RULES: dict[str, str] = {
    "generators": "count",
    "learners": "count",
    "rollouts_per_batch": "count",
    "batch_size": "count",
    "capacity": "count",
    "epochs": "count",
    "sync_every": "count",
    "max_pending_batches": "count",
    "steps": "count",
    "per_learner_batch": "count",
    "max_staleness": "index",
    "learn_seconds": "positive",
    "gen_seconds": "positive",
    "mu": "positive",
    "replay_ratio": "positive",
    "mus": "positive",
    "gen_spread": "nonnegative",
    "learn_spread": "nonnegative",
    "sync_seconds": "nonnegative",
    "syncs": "nonnegative",
    "alpha": "nonnegative",
    "rho": "nonnegative",
}
_MEANING = {
    "count": "a whole number >= 1",
    "index": "a whole number >= 0",
    "positive": "a finite number > 0",
    "nonnegative": "a finite number >= 0",
}


def _flag(dest: str) -> str:
    named = {d: f for f, d, _, _, _ in _SPEC_FLAGS}
    return named.get(dest, "--" + dest.replace("_", "-"))


def check_args(args: argparse.Namespace) -> None:
    """Refuse a number the model cannot run with (NaN, inf, 0 where a count is needed),
    naming the flag as the user typed it: a ValueError, which the CLI prints as one line
    and exits 2. --gpus needs 2 or more (one learner and at least one generator)."""
    for dest, rule in _RULES.items():
        value = getattr(args, dest, None)
        for v in value if isinstance(value, list) else [value]:
            if v is None:  # not given: the flag's default or the other form (--mu)
                continue
            ok = math.isfinite(v) and (
                v >= 1 if rule == "count" else v > 0 if rule == "positive" else v >= 0
            )
            if not ok:
                raise ValueError(f"{_flag(dest)} must be {_MEANING[rule]}, got {v!r}")
    for g in getattr(args, "gpus", None) or []:
        if g < 2:
            raise ValueError(f"--gpus must each be 2 or more (a learner and a generator), got {g}")


# flag, SystemSpec field, type, default, help
_SPEC_FLAGS: tuple[tuple[str, str, type, Any, str], ...] = (
    ("--generators", "generators", int, 1, "W generator workers"),
    ("--learners", "learners", int, 1, "T data-parallel learners"),
    ("--rollouts-per-batch", "rollouts_per_batch", int, 64, "R per delivery"),
    ("--batch", "batch_size", int, 64, "B rollouts per learner step"),
    ("--capacity", "capacity", int, None, "FIFO size N (omit: the on-policy queue)"),
    ("--learn-seconds", "learn_seconds", float, 0.3, "learner s/trained rollout"),
    ("--gen-spread", "gen_spread", float, 0.2, "CV of a delivery's time"),
    ("--learn-spread", "learn_spread", float, 0.1, "CV of a step's time"),
    ("--epochs", "epochs", int, 1, "passes over each batch"),
    ("--sync-seconds", "sync_seconds", float, 0.0, "a generator's weight load"),
    ("--sync-every", "sync_every", int, 1, "publish every k learner steps"),
    ("--replay-ratio", "replay_ratio", float, None, "pace: uses per generated rollout"),
    ("--max-staleness", "max_staleness", int, None, "drop rollouts older than this"),
    ("--max-pending-batches", "max_pending_batches", int, 4, "deliveries unread"),
)


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="the asynchronous generator/learner system as a discrete-event model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--from-run", metavar="RUN_DIR", help="model a finished async run, compare")
    for flag, dest, kind, default, text in _SPEC_FLAGS:
        p.add_argument(flag, dest=dest, type=kind, default=default, help=text)
    p.add_argument("--gen-seconds", type=float, help="generator seconds per rollout")
    p.add_argument("--mu", type=float, help="or: generation / training cost per rollout")
    p.add_argument("--wait-on-stale", action="store_true", help="on_stale: wait")
    p.add_argument("--steps", type=int, help="learner steps to simulate (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--cluster-table", action="store_true", help="paper 1's design, 8-512 GPUs")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 32, 128, 512])
    p.add_argument("--mus", type=float, nargs="+", default=[5.3, 6.8])
    p.add_argument("--syncs", type=float, nargs="+", default=[1.0, 10.0, 30.0])
    p.add_argument("--per-learner-batch", type=int, default=64)
    p.add_argument("--alpha", type=float, default=0.25, help="power-law exponent (design)")
    p.add_argument("--rho", type=float, default=0.5, help="buffer correlation (design)")
    p.set_defaults(func=cmd_simulate)
