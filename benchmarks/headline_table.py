"""README's headline table from a held-out suite's summary.json (`replayrl bench suite heldout
... --no-run` writes it): one row per variant, over the tasks, with the suite's own
intervals and claims and the runs behind each; and a line of the baseline's median final
per task.

    python benchmarks/headline_table.py runs/bench/heldout/summary.json

The intervals and claims are the suite's (bench/evidence.py); this adds only counts and
the baseline's medians.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

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
    rows = [
        "| method | runs (seeds per task) | generated rollouts to 90% of the baseline's gain, "
        "ratio (median over tasks) | final minus the baseline's (mean over tasks) "
        "| P(improvement) | claim by the rule |",
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path)
    args = p.parse_args()
    print(table(json.loads(args.summary.read_text())), end="")


if __name__ == "__main__":
    main()
