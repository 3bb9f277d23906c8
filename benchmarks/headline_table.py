"""README's headline table: one row per method over the tasks, with intervals and claims.

From the committed per-run records of a block (every method of the block in one table, so
that Holm's control covers all of them), recomputed with bench/evidence.py:

    python benchmarks/headline_table.py --records benchmarks/results/heldout/runs \
        --baseline grpo-p16 --tasks add6 sub6 sub5m2 add5m2h \
        --methods remix-grpo replay-posbias placebo ar3po dapo repo grpo-p8 grpo-utd4 \
        --suite-summaries benchmarks/results/heldout/block-0811966/summary.json \
            benchmarks/results/heldout/block-0811966/controls/summary.json

Each method's runs are every `<task>/<method>-s<seed>.json` in the folder (the same seeds
on every task). The over-task intervals resample tasks, then seeds within each drawn task;
the stratified one (seeds within the tasks run) is beside it. The wall-time and modelled
compute (mu 5.3) columns are the suite's point estimates from its summaries (first
evaluation at the target; the records hold no trained-rollout counts to recompute them).
`--per-task` adds the per-task table with the same rule.

Or from a held-out suite's summary.json (`replayrl bench suite heldout ... --no-run`), the
suite's own figures:

    python benchmarks/headline_table.py runs/bench/heldout/summary.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from replayrl.bench.evidence import (
    PLACEBO,
    across_tasks,
    check_blocks,
    evidence_table,
    task_evidence,
)
from replayrl.bench.intervals import HIERARCHICAL, STRATIFIED
from replayrl.config.schema import ConfigError

LABELS = {
    "placebo": "placebo: GRPO again, other sampling seeds",
    "replay-posbias": "replay, positive bias (`replay`, delta 0.2)",
    "remix-grpo": "ReMix-GRPO (`remix-grpo`)",
    "ar3po": "AR3PO (`ar3po`)",
    "dapo": "DAPO (`dapo`)",
    "repo": "RePO (`repo`)",
    "grpo-p8": "GRPO control: 8 x 8 for 160 steps (`grpo-p8`)",
    "grpo-utd4": "GRPO control: 4 updates per batch (`grpo-utd4`)",
}


def interval(d: dict[str, Any], fmt: str, unit: str = "") -> str:
    def one(v: float | None) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return "never" if math.isinf(v) else format(v, fmt) + unit

    if d.get("low") is None or math.isnan(d["low"]):
        return f"{one(d['estimate'])} (no interval)"
    return f"{one(d['estimate'])} [{one(d['low'])}, {one(d['high'])}]"


def ratio_from_json(d: dict[str, Any], resampled: bool) -> dict[str, float]:
    """The rollouts ratio's interval as the suite computed it. summary.json writes +inf and NaN
    both as null; in a ratio, +inf is a median that never crosses (`never`) and NaN only an
    interval that was not computed (a task with fewer than 2 runs of the method or the
    baseline, `resampled` False). So null reads back as +inf, except for the ends of an
    interval that was not computed."""

    def back(v: float | None, missing: float) -> float:
        return missing if v is None else float(v)

    ends = math.inf if resampled else math.nan
    return {
        "estimate": back(d["estimate"], math.inf),
        "low": back(d["low"], ends),
        "high": back(d["high"], ends),
    }


def _span(counts: list[int]) -> str:
    return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def table(summary: dict[str, Any]) -> str:
    base = summary["baseline"]
    tasks = summary["tasks"]
    over = summary.get("evidence_over_tasks")
    missing = [t for t, v in tasks.items() if not v.get("evidence")]
    if not over or missing:
        raise SystemExit(
            "this summary has no intervals (evidence): "
            + (f"tasks without them: {missing}" if missing else "none over tasks")
            + "; make it with `replayrl bench suite heldout ... --no-run` (scipy installed)"
        )
    # a summary written before intervals resampled tasks has no level: it was stratified
    levels = {r.get("resampling", STRATIFIED) for r in over.values()}
    level = f"; {LEVELS[levels.pop()]}" if len(levels) == 1 else ""
    rows = [
        "| method | runs (seeds per task) | generated rollouts to 90% of the baseline's gain, "
        f"ratio (median over tasks{level}) | final minus the baseline's (mean over tasks"
        f"{level}) | P(improvement) | claim by the rule |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in over.items():
        claim = r["claim"]
        if "placebo_consistent" in r:
            ok = r["placebo_consistent"]
            claim += {True: " (looks like noise)", False: " (NOT like noise)", None: ""}[ok]
        counts = [len(tasks[t]["evidence"]["variants"][name]["finals"]) for t in r["tasks"]]
        base_counts = [len(tasks[t]["evidence"]["variants"][base]["finals"]) for t in r["tasks"]]
        ratio = ratio_from_json(r["ratio"], min(counts + base_counts) >= 2)
        rows.append(
            f"| {LABELS.get(name, name)} | {sum(counts)} ({_span(counts)}) "
            f"| {interval(ratio, '.2f', 'x')} "
            f"| {interval(r['difference'], '+.3f')} "
            f"| {interval(r['probability_of_improvement'], '.2f')} | {claim} |"
        )
    finals, counts = [], []
    for task, t in tasks.items():
        f = t["evidence"]["variants"][base]["finals"]
        finals.append(f"{task} {statistics.median(f):.3f}")
        counts.append(len(f))
    foot = (
        f"\nBaseline `{base}` ({_span(counts)} seeds per task), median final per task "
        "(mean of the last 3 evaluations): " + ", ".join(finals) + "."
    )
    return "\n".join(rows) + "\n" + foot + "\n"


LEVELS = {HIERARCHICAL: "tasks, then seeds", STRATIFIED: "seeds within these tasks"}


def load_records(
    folder: Path, tasks: list[str], variants: list[str]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{task: {variant: [record per seed, by seed]}} of every record of `variants` under
    `folder/<task>/`; ConfigError when a variant has no record on a task, its seeds differ
    between tasks, or a record says it is another run than its file name."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {} for t in tasks}
    seeds: dict[str, set[int]] = {}
    problems = []
    for task in tasks:
        for variant in variants:
            found = {}
            for path in sorted((folder / task).glob(f"{variant}-s*.json")):
                seed = path.stem.removeprefix(f"{variant}-s")
                if not seed.isdigit():
                    continue  # another variant whose name starts with this one's
                record = json.loads(path.read_text())
                if (record.get("task"), record.get("variant"), record.get("seed")) != (
                    task,
                    variant,
                    int(seed),
                ):
                    problems.append(f"{path}: the record is another run")
                found[int(seed)] = record
            if not found:
                problems.append(f"{folder / task}: no records of {variant}")
            elif seeds.setdefault(variant, set(found)) != set(found):
                problems.append(
                    f"{variant}: seeds {sorted(found)} on {task}, not {sorted(seeds[variant])}"
                )
            runs[task][variant] = [found[k] for k in sorted(found)]
    if problems:
        raise ConfigError("records that cannot be used:\n  " + "\n  ".join(problems))
    return runs


def suite_costs(paths: list[Path]) -> dict[str, dict[str, float]]:
    """Per method, the suite's medians over tasks of its wall-time and modelled-compute (mu
    5.3) ratios to 90% of the baseline's gain (first evaluation at the target)."""
    out: dict[str, dict[str, float]] = {}
    for path in paths:
        over = json.loads(path.read_text())["median_over_tasks"]
        for name, r in over.items():
            out.setdefault(
                name,
                {
                    "wall": _median(r.get("gain90_wall_seconds_ratio")),
                    "compute": _median(r.get("gain90_compute_paper_mu_ratio")),
                },
            )
    return out


def _median(d: dict[str, Any] | None) -> float:
    v = (d or {}).get("median")
    return math.inf if v is None else float(v)  # summary.json writes +inf (never) as null


def _beside(r: dict[str, Any]) -> dict[str, float]:
    """The ratio at the other resampling level (stratified beside hierarchical)."""
    other = [k for k in r if k.startswith("ratio_")]
    if len(other) != 1:
        raise ValueError(f"expected one other resampling level, got {other}")
    return r[other[0]]


def _ratio_cell(r: dict[str, float]) -> str:
    return interval(r, ".2f", "x")


def _target_cell(t: dict[str, Any]) -> str:
    return f"{_ratio_cell(t['ratio'])}: {t['claim'].split(';')[0]}"


def records_headline(
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    baseline: str,
    costs: dict[str, dict[str, float]] | None = None,
    seed: int = 0,
    per_task: bool = False,
) -> str:
    """Markdown: the headline table of `runs` against `baseline` (module docstring)."""
    blocks = check_blocks(runs, mixed=False)
    evidence = {t: task_evidence(results, baseline, seed=seed) for t, results in runs.items()}
    over = across_tasks(evidence, runs, baseline, seed=seed)
    family = len([n for n in over if n != PLACEBO])
    levels = {r["resampling"] for r in over.values()}
    level = LEVELS[levels.pop()] if len(levels) == 1 else "mixed levels"
    beside = LEVELS[HIERARCHICAL if level == LEVELS[STRATIFIED] else STRATIFIED]
    rows = [
        "| method | runs (seeds per task) | rollouts to 90% of the gain, ratio (median over "
        f"tasks): {level} | the same: {beside} | final minus the "
        f"baseline's (mean over tasks): {level} | claim at 90% (Holm over {family}) "
        "| at 80% of the gain | at 95% of the gain | wall time to 90% | modelled compute to "
        "90% (mu 5.3) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in over.items():
        counts = [len(evidence[t]["variants"][name]["finals"]) for t in r["tasks"]]
        claim = r["claim"]
        if name == PLACEBO:
            ok = r.get("placebo_consistent")
            claim += {True: " (looks like noise)", False: " (NOT like noise)", None: ""}[ok]
        cost = (costs or {}).get(name, {})
        money = [
            "-" if k not in cost else ("never" if math.isinf(cost[k]) else f"{cost[k]:.2f}x")
            for k in ("wall", "compute")
        ]
        rows.append(
            f"| {LABELS.get(name, name)} | {sum(counts)} ({_span(counts)}) "
            f"| {_ratio_cell(r['ratio'])} | {_ratio_cell(_beside(r))} "
            f"| {interval(r['difference'], '+.3f')} | {claim} "
            f"| {_target_cell(r['targets']['0.8'])} | {_target_cell(r['targets']['0.95'])} "
            f"| {money[0]} | {money[1]} |"
        )
    finals = [
        f"{t} {statistics.median(e['variants'][baseline]['finals']):.3f}"
        for t, e in evidence.items()
    ]
    base_runs = [len(e["variants"][baseline]["finals"]) for e in evidence.values()]
    text = "\n".join(rows) + (
        f"\n\nBaseline `{baseline}` ({_span(base_runs)} seeds per task), median final per task "
        "(mean of the last 3 evaluations): " + ", ".join(finals) + ".\n"
    )
    if per_task:
        text += "\n" + evidence_table(evidence, over, baseline, blocks)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path, nargs="?", help="a suite's summary.json")
    p.add_argument("--records", type=Path, help="a block's per-run records folder")
    p.add_argument("--baseline")
    p.add_argument("--tasks", nargs="+")
    p.add_argument("--methods", nargs="+", help="the table's methods, the placebo's included")
    p.add_argument("--suite-summaries", nargs="*", type=Path, default=[])
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--per-task", action="store_true")
    args = p.parse_args(argv)
    if args.records is None:
        if args.summary is None:
            p.error("give a summary.json or --records")
        print(table(json.loads(args.summary.read_text())), end="")
        return 0
    if not (args.baseline and args.tasks and args.methods):
        p.error("--records needs --baseline, --tasks and --methods")
    try:
        runs = load_records(args.records, args.tasks, [args.baseline, *args.methods])
        costs = suite_costs(args.suite_summaries)
        print(
            records_headline(runs, args.baseline, costs, args.bootstrap_seed, args.per_task), end=""
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
