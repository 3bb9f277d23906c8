"""The suite's evidence table: per task and over tasks, each method against the baseline with
intervals (bench/intervals.py) and claims by a stated rule, the placebo's intervals, and the
blocks (machine, commit, warm start) its rows come from; plus the small per-run records
(curve and provenance, no checkpoints) a committed table traces to.

Per task, against the baseline's robust targets (bench/robust.py: 3-eval trailing means):

- rollouts to 90% of the baseline's median gain, as a ratio of medians with a 90% interval
  whose bootstrap refits that target on each resample of the baseline's runs; a run that
  never gets there is +inf (censored, see intervals.py);
- final difference: mean over runs of each run's mean of its last 3 evaluations, method
  minus baseline, with a 90% interval;
- take-off: the share of runs whose trailing mean reaches 50% of the baseline's gain, with an
  exact binomial interval (a task where some seeds never learn: speed and take-off apart).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replayrl.bench.claims import RULE_HOLM, Estimate, holm_claims
from replayrl.bench.intervals import (
    HIERARCHICAL,
    LEVEL,
    STRATIFIED,
    claim,
    crossing_ratio_distribution,
    difference_over_tasks_distribution,
    ends,
    final_difference_distribution,
    placebo_consistent,
    probability_of_improvement,
    ratio_over_tasks_distribution,
    takeoff_interval,
)
from replayrl.bench.robust import curve, final_mean, robust_gain_targets, smoothed_crossing
from replayrl.bench.targets import HEADLINE
from replayrl.config.schema import ConfigError
from replayrl.storage.io import atomic_write_text

TAKEOFF = 0.5  # a run takes off when its trailing mean reaches 50% of the baseline's gain
MIN_EVAL_PROMPTS = 500  # final evaluations on fewer prompts: one eval's error is too wide
PLACEBO = "placebo"  # the baseline again on another sampling-seed stream
PLACEBO_SEED_OFFSET = 1000
# the targets claims are made at: the headline (90% of the baseline's gain) and two beside it
CLAIM_FRACTIONS = (0.8, HEADLINE, 0.95)


def _iv_of(e: Estimate, level: float = LEVEL) -> dict[str, float]:
    """{"estimate", "low", "high"} of an (estimate, bootstrap distribution) pair."""
    low, high = ends(e[1], level)
    return {"estimate": e[0], "low": low, "high": high}


def apply_claims(
    rows: dict[str, dict[str, Any]],
    ratios: dict[str, dict[float, Estimate]],
    differences: dict[str, Estimate],
) -> None:
    """Set each row's claims: per target, Holm's over the rows' methods (bench/claims.py;
    the placebo aside, judged alone); `claim` is the headline target's. `claim_unadjusted`
    keeps each method's claim by its own 90% intervals, for comparison."""
    family = [n for n in rows if n != PLACEBO]
    for f in CLAIM_FRACTIONS:
        held = holm_claims(
            {n: ratios[n].get(f) for n in family}, {n: differences[n] for n in family}
        )
        for name, row in rows.items():
            target = row["targets"][str(f)]
            if name == PLACEBO:
                target["claim"] = claim(target["ratio"], row["difference"])
            else:
                target["claim"] = held[name]["claim"]
                target["family"] = held[name]["family"]
    for row in rows.values():
        row["claim"] = row["targets"][str(HEADLINE)]["claim"]


def block_of(summary: dict[str, Any]) -> tuple[str, str]:
    """(machine, commit) a run ran on: the CPU model and the id of its kernels' inputs
    (run/records/provenance.py), `unknown` for runs written without provenance; a commit with
    uncommitted edits is marked `+dirty`."""
    p = summary.get("provenance") or {}
    commit = p.get("commit") or "unknown"
    if p.get("dirty"):
        commit += "+dirty"
    machine = f"{p['cpu_model']} ({p['machine_id']})" if p.get("machine_id") else "unknown"
    return machine, commit


def warmstart_of(summary: dict[str, Any]) -> str:
    return str((summary.get("provenance") or {}).get("warmstart_sha256") or "unknown")


def check_blocks(
    per_task: dict[str, dict[str, list[dict[str, Any]]]], mixed: bool
) -> dict[tuple[str, str], str]:
    """Name each (machine, commit) block of the runs `A`, `B`, ...; refuse (ConfigError) when
    there is more than one, or a task's runs start from different warm starts, unless
    `mixed`, when every row is labelled with its blocks instead."""
    blocks: dict[tuple[str, str], str] = {}
    problems = []
    for task, results in per_task.items():
        for runs in results.values():
            for s in runs:
                blocks.setdefault(block_of(s), chr(ord("A") + len(blocks)))
        sha = {warmstart_of(s) for runs in results.values() for s in runs}
        if len(sha) > 1:
            problems.append(f"task {task}: runs start from {len(sha)} different warm starts")
    if len(blocks) > 1:
        problems.append(
            "runs from more than one machine or commit: "
            + "; ".join(f"{b}: {m}, commit {c[:12]}" for (m, c), b in blocks.items())
        )
    if problems and not mixed:
        raise ConfigError(
            "refusing one table over runs that are not comparable (pass --mixed to label each "
            "row with its block instead):\n  " + "\n  ".join(problems)
        )
    return blocks


PEER_KEYS = ("peer", "trl_version", "unmatched_settings")
EVAL_EXTRA = ("tokens_generated", "tokens_trained", "rollouts_trained")


STEP_BINS = 32  # per-step metrics kept as at most this many spans of consecutive steps
# per-step keys of metrics.jsonl kept in a record: cumulative counters (the span's last value)
STEP_COUNTERS = {
    "rollouts_generated": "rollouts_generated",
    "tokens_generated": "tokens_generated",
    "tokens_trained": "tokens_trained",
    "wall_seconds": "wall_seconds",
}
# ... per-step shares and means (the mean over the span's steps that have them)
STEP_MEANS = {
    "zero_advantage": "signal/frac_reward_zero_std",  # groups whose rewards are all equal
    "staleness": "batch/age_mean",  # policy versions behind the learner
    "ess": "train/ess",  # effective sample size / N of the importance weights
}
# ... per-step seconds (summed over the span)
STEP_SUMS = {"generation_s": "time/generation_s", "training_s": "time/training_s"}


def _replayed_share(row: dict[str, Any]) -> float | None:
    """Share of the step's trained tokens that were replayed (stale) rather than fresh."""
    on, off = row.get("train/on_policy/tokens"), row.get("train/off_policy/tokens")
    if on is None and off is None:
        return None
    total = float(on or 0) + float(off or 0)
    return float(off or 0) / total if total else None


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.4g}")


def step_metrics(rows: list[dict[str, Any]], bins: int = STEP_BINS) -> dict[str, list[Any]]:
    """metrics.jsonl's per-step rows cut to at most `bins` spans of consecutive steps, as
    columns (a few kilobytes a run, small enough to commit): each span's last step, the
    cumulative counters at its end, the mean of each share over its steps (None when no step
    of it has one) and its summed seconds. What `benchmarks/waste_figure.py` draws."""
    rows = [r for r in rows if r.get("step") is not None]
    if not rows:
        return {}
    edges = np.linspace(0, len(rows), min(bins, len(rows)) + 1).round().astype(int)
    spans = [rows[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
    cols: dict[str, list[Any]] = {"step": [int(sp[-1]["step"]) for sp in spans]}
    cols["steps"] = [len(sp) for sp in spans]
    for out, key in STEP_COUNTERS.items():
        cols[out] = [_round(sp[-1].get(key)) for sp in spans]
    means: dict[str, Any] = {k: (lambda r, key=key: r.get(key)) for k, key in STEP_MEANS.items()}
    means["replayed"] = _replayed_share
    for out, get in means.items():
        cols[out] = []
        for sp in spans:
            vals = [float(v) for v in map(get, sp) if v is not None]
            cols[out].append(_round(sum(vals) / len(vals)) if vals else None)
    for out, key in STEP_SUMS.items():
        cols[out] = [_round(sum(float(r.get(key) or 0) for r in sp)) for sp in spans]
    return {k: v for k, v in cols.items() if any(x is not None for x in v)}


def run_record(
    summary: dict[str, Any],
    task: str | None,
    variant: str,
    seed: int,
    metrics: list[dict[str, Any]] | None = None,
) -> dict:
    """A run's committed record: what it was, where it ran, its evaluation curve and, given
    its metrics.jsonl rows, its per-step metrics in spans (`step_metrics`)."""
    keys = (
        "final_eval_accuracy",
        "rollouts_generated",
        "tokens_generated",
        "steps",
        "wall_seconds",
        "generation_seconds",
        "training_seconds",
        "num_eval_prompts",
    )
    # local paths (the cache, the run folder) say nothing on another machine: the warm start
    # is named by its hash
    prov = {k: v for k, v in (summary.get("provenance") or {}).items() if k != "warmstart_path"}
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        **{k: summary.get(k) for k in keys},
        # a peer trainer's run (bench/peers) says which trainer and what it could not match
        **{k: summary[k] for k in PEER_KEYS if k in summary},
        "provenance": prov or None,
        "evals": [
            {k: e.get(k) for k in ("step", "rollouts_generated", "eval/accuracy", "wall_seconds")}
            # trained counts, where the loop records them: modelled compute from the record
            | {k: e[k] for k in EVAL_EXTRA if e.get(k) is not None}
            for e in summary.get("evals") or []
        ],
        **({"step_metrics": step_metrics(metrics)} if metrics else {}),
    }


def run_record_path(folder: Path, task: str | None, variant: str, seed: int) -> Path:
    """Where a run's record lives: `folder/<task>/<variant>-s<seed>.json`."""
    return (folder / task if task else folder) / f"{variant}-s{seed}.json"


def write_run_record(folder: Path, record: dict[str, Any]) -> Path:
    """Write a record at `run_record_path` (atomic; small: no checkpoints, per-step metrics
    in at most `STEP_BINS` spans)."""
    path = run_record_path(folder, record["task"], record["variant"], record["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, default=_no_inf) + "\n")
    return path


def _no_inf(x: Any) -> Any:
    return str(x)


def _crossings(runs: list[dict[str, Any]], target: float) -> list[float]:
    return [smoothed_crossing(*curve(s), target) for s in runs]


def _finals(runs: list[dict[str, Any]]) -> list[float]:
    return [final_mean(curve(s)[1]) for s in runs]


def task_evidence(
    results: dict[str, list[dict[str, Any]]], baseline: str, seed: int = 0
) -> dict[str, Any]:
    """Per variant on one task: the raw per-run figures and their intervals against
    `baseline` (see the module docstring)."""
    base = results[baseline]
    g = robust_gain_targets(base)
    target, takeoff_at = g["targets"][HEADLINE], g["start"] + TAKEOFF * g["gain"]
    budget = statistics.median(float(s["rollouts_generated"]) for s in base)
    b_final, b_curves = _finals(base), [curve(s) for s in base]
    out: dict[str, Any] = {
        "target": target,
        "budget": budget,
        "eval_prompts": min(
            int(s.get("num_eval_prompts") or 0) for rs in results.values() for s in rs
        ),
        "variants": {},
    }
    claimed: dict[str, dict[str, Any]] = {}
    ratios: dict[str, dict[float, Estimate]] = {}
    diffs: dict[str, Estimate] = {}
    for name, runs in results.items():
        cross, finals = _crossings(runs, target), _finals(runs)
        took = sum(math.isfinite(x) for x in _crossings(runs, takeoff_at))
        row: dict[str, Any] = {
            "crossings": cross,
            "finals": finals,
            "takeoff": takeoff_interval(took, len(runs)),
            "blocks": sorted({block_of(s) for s in runs}),
        }
        if name != baseline:
            try:
                ratios[name] = {
                    f: crossing_ratio_distribution(
                        [curve(s) for s in runs], b_curves, budget, f, seed=seed
                    )
                    for f in CLAIM_FRACTIONS
                }
            except ValueError as exc:  # say which arm's runs, not only an index
                raise ValueError(f"{name} against {baseline}: {exc}") from exc
            diffs[name] = final_difference_distribution(finals, b_final, seed=seed)
            row["ratio"] = _iv_of(ratios[name][HEADLINE])
            row["difference"] = _iv_of(diffs[name])
            row["targets"] = {str(f): {"ratio": _iv_of(e)} for f, e in ratios[name].items()}
            row["claim_unadjusted"] = claim(row["ratio"], row["difference"])
            if name == PLACEBO:
                row["placebo_consistent"] = placebo_consistent(row["ratio"], row["difference"])
            claimed[name] = row
        out["variants"][name] = row
    apply_claims(claimed, ratios, diffs)
    return out


def across_tasks(
    per_task: dict[str, dict[str, Any]],
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    baseline: str,
    seed: int = 0,
    resampling: str = HIERARCHICAL,
) -> dict:
    """Per variant run on every task: median over tasks of the rollouts ratio (at each of
    `CLAIM_FRACTIONS`) and mean final difference, resampled at `resampling`'s level
    (hierarchical: tasks, then seeds within each; the other level beside it, labelled), with
    Holm-controlled claims over the variants; the probability of improvement (seeds within
    each task). `per_task` is `task_evidence` per task, `runs` the run summaries it was made
    from (the ratio's bootstrap refits the target from their curves)."""
    names = [n for n in next(iter(per_task.values()))["variants"] if n != baseline]
    out: dict[str, Any] = {}
    ratios: dict[str, dict[float, Estimate]] = {}
    diffs: dict[str, Estimate] = {}
    for name in names:
        tasks = [t for t, e in per_task.items() if name in e["variants"]]
        if len(tasks) < len(per_task):
            continue  # not run on every task: no figure over tasks
        rows = [(per_task[t]["variants"][name], per_task[t]["variants"][baseline]) for t in tasks]
        curves = [
            ([curve(s) for s in runs[t][name]], [curve(s) for s in runs[t][baseline]])
            for t in tasks
        ]
        finals = [(v["finals"], b["finals"]) for v, b in rows]
        budgets = [per_task[t]["budget"] for t in tasks]
        ratios[name] = {
            f: ratio_over_tasks_distribution(curves, budgets, f, seed=seed, resampling=resampling)
            for f in CLAIM_FRACTIONS
        }
        diffs[name] = difference_over_tasks_distribution(finals, seed=seed, resampling=resampling)
        # the other level beside it, labelled: seeds within the four tasks, the tasks fixed
        other = STRATIFIED if resampling == HIERARCHICAL else HIERARCHICAL
        beside = ratio_over_tasks_distribution(
            curves, budgets, HEADLINE, seed=seed, resampling=other
        )
        out[name] = {
            "tasks": tasks,
            "resampling": resampling,
            "ratio": _iv_of(ratios[name][HEADLINE]),
            "difference": _iv_of(diffs[name]),
            f"ratio_{other}": _iv_of(beside),
            f"difference_{other}": _iv_of(
                difference_over_tasks_distribution(finals, seed=seed, resampling=other)
            ),
            "targets": {str(f): {"ratio": _iv_of(e)} for f, e in ratios[name].items()},
            # seeds within each task (stratified): a probability over the tasks run
            "probability_of_improvement": probability_of_improvement(finals, seed=seed),
        }
        out[name]["claim_unadjusted"] = claim(out[name]["ratio"], out[name]["difference"])
        if name == PLACEBO:
            out[name]["placebo_consistent"] = placebo_consistent(
                out[name]["ratio"], out[name]["difference"]
            )
    apply_claims(out, ratios, diffs)
    return out


def _iv(d: dict[str, float], fmt: Callable[[float], str]) -> str:
    if math.isnan(d["low"]):
        return f"{fmt(d['estimate'])} (one run: no interval)"
    return f"{fmt(d['estimate'])} [{fmt(d['low'])}, {fmt(d['high'])}]"


def _x(v: float) -> str:
    return "never" if math.isinf(v) else f"{v:.2f}x"


def _pp(v: float) -> str:
    return f"{v:+.3f}"


def _share(v: float) -> str:
    return f"{v:.2f}"


def _beside(r: dict[str, Any]) -> str:
    """The claims at the targets beside the headline's (80% and 95% of the gain)."""
    t = r.get("targets") or {}
    return " / ".join(
        t[k]["claim"].split(";")[0] for k in ("0.8", "0.95") if "claim" in t.get(k, {})
    )


def _placebo_cell(ok: bool | None) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[ok]


def evidence_table(
    per_task: dict[str, dict[str, Any]],
    over: dict[str, Any],
    baseline: str,
    blocks: dict[tuple[str, str], str],
    rule: str | None = None,
) -> str:
    """Markdown: per task and over tasks, each variant against `baseline` with intervals and
    claims; the placebo's check; the blocks the rows come from."""
    lvl = f"{LEVEL:.0%}"
    lines = [
        f"Against `{baseline}`" + (f" ({rule})" if rule else "") + f", {lvl} intervals "
        "(scipy bootstrap over seeds, percentile; over the tasks hierarchical: tasks "
        "resampled, then seeds within each drawn task, the stratified interval (seeds within "
        "the tasks run, tasks fixed) beside it; take-off: exact binomial). Rollouts ratio: "
        "median generated rollouts until the 3-eval trailing mean reaches 90% of the "
        "baseline's gain, over the baseline's (runs that never reach it count as never, not "
        "dropped; each bootstrap resample refits the target from its resample of the "
        "baseline's runs). Final difference: each run's mean of its last 3 evaluations, mean over "
        f"runs, minus the baseline's. Take-off: runs reaching {TAKEOFF:.0%} of the gain.",
        "",
        RULE_HOLM,
        "",
        "| task | variant | runs | block | rollouts ratio | final difference | take-off | claim | "
        "claim at 80% / 95% of the gain | placebo looks like noise |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, ev in per_task.items():
        for name, r in ev["variants"].items():
            block = ",".join(blocks.get(tuple(b), "?") for b in r["blocks"])
            take = _iv(r["takeoff"], _share)
            runs = len(r["finals"])  # a variant may have fewer seeds in than the baseline
            if name == baseline:
                lines.append(
                    f"| {task} | {name} (baseline) | {runs} | {block} | 1 | 0 | {take} | | | |"
                )
                continue
            placebo = _placebo_cell(r.get("placebo_consistent")) if name == PLACEBO else ""
            lines.append(
                f"| {task} | {name} | {runs} | {block} | {_iv(r['ratio'], _x)} | "
                f"{_iv(r['difference'], _pp)} | {take} | {r['claim']} | {_beside(r)} | {placebo} |"
            )
    for name, r in over.items():
        placebo = _placebo_cell(r.get("placebo_consistent")) if name == PLACEBO else ""
        runs = sum(len(per_task[t]["variants"][name]["finals"]) for t in r["tasks"])
        other = STRATIFIED if r.get("resampling", HIERARCHICAL) == HIERARCHICAL else HIERARCHICAL
        beside = f"; {other} {_iv(r[f'ratio_{other}'], _x)}" if f"ratio_{other}" in r else ""
        lines.append(
            f"| **over {len(r['tasks'])} tasks** | {name} | {runs} | "
            f"| {_iv(r['ratio'], _x)} (median, {r.get('resampling', HIERARCHICAL)}{beside}) "
            f"| {_iv(r['difference'], _pp)} (mean) | P(improvement) "
            f"{_iv(r['probability_of_improvement'], _share)} | {r['claim']} | {_beside(r)} "
            f"| {placebo} |"
        )
    prompts = min(ev["eval_prompts"] for ev in per_task.values())
    if 0 < prompts < MIN_EVAL_PROMPTS:
        lines += [
            "",
            f"Evaluations on {prompts} prompts: below the {MIN_EVAL_PROMPTS} these claims "
            "assume (one evaluation's binomial error is wider than the no-loss margin).",
        ]
    lines += ["", "Blocks (machine, commit):"]
    lines += [f"- {b}: {m}, commit {c}" for (m, c), b in blocks.items()]
    return "\n".join(lines) + "\n"
