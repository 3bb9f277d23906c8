"""CPU hours the next held-out block needs, estimated from the committed records' wall times:
GRPO's grid on the tuning task (suite `grpo-grid`), the headroom probe of the candidate
tasks, then suite `heldout8`'s main arms and controls on eight tasks.

    python benchmarks/block_cost.py --records benchmarks/results/heldout/runs \\
        --tuning benchmarks/results/tuning/remix-fair/summary.json

Each planned arm is costed as the measured arm it does the same work per step as (the
mapping is in `PLAN`, with the reason): its median wall seconds per run over the block's
records, per task on the four tasks it ran on, its median over them on a new task; tuning
cells as the tuning round's GRPO settings on the tuning task (one torch thread a run, so a
run's wall seconds are its CPU seconds). Elapsed time is CPU time over --jobs (runs at
once, one per core): a lower bound, as no machine here runs two runs at full speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

OLD_TASKS = ["add6", "sub6", "sub5m2", "add5m2h"]
NEW_TASKS = 4  # chosen by the headroom rule from six candidates
CANDIDATES = 6
SEEDS = 5
# (stage, planned arm, measured arm it costs as, why)
PLAN = [
    ("main", "baseline (grid's pick)", "grpo-p16", "GRPO, one pass; the pick's shape unknown"),
    ("main", "placebo", "placebo", "the baseline again"),
    ("main", "remix-grpo", "remix-grpo", "unchanged"),
    ("main", "replay-posbias", "replay-posbias", "unchanged"),
    ("main", "grpo-fresh-updates", "grpo-p8", "8 x 8, one pass over each batch (in 4 parts)"),
    ("controls", "ar3po", "ar3po", "unchanged"),
    ("controls", "dapo", "dapo", "unchanged"),
    ("controls", "repo", "repo", "unchanged"),
]
GRID = {"u1": ("grpo.lr1e-4", 8), "u4": ("grpo.utd4", 8)}  # cells per updates-per-batch


def wall_per_task(folder: Path) -> dict[str, dict[str, float]]:
    """{variant: {task: median wall seconds per run}} over the block's records."""
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in folder.glob("*/*.json"):
        r = json.loads(path.read_text())
        if r.get("wall_seconds") is not None:
            seen[r["variant"]][r["task"]].append(float(r["wall_seconds"]))
    return {v: {t: statistics.median(w) for t, w in ts.items()} for v, ts in seen.items()}


def estimate(walls: dict[str, dict[str, float]], tuning: dict[str, float]) -> list[tuple]:
    """Rows (stage, arm, runs, CPU hours) of the plan."""
    rows = []
    for label, (setting, cells) in GRID.items():
        runs = cells * SEEDS
        rows.append(("grid", f"{cells} cells, {label}", runs, runs * tuning[setting] / 3600))
    placebo = SEEDS * tuning["grpo.lr1e-4"] / 3600
    rows.append(("grid", "placebo", SEEDS, placebo))
    base = walls["grpo-p16"]
    probe = CANDIDATES * statistics.median(base.values()) / 3600
    rows.append(("probe", "baseline, seed 0", CANDIDATES, probe))
    for stage, arm, like, _ in PLAN:
        w = walls[like]
        new = statistics.median(w.values())
        secs = SEEDS * (sum(w[t] for t in OLD_TASKS) + NEW_TASKS * new)
        rows.append((stage, arm, SEEDS * (len(OLD_TASKS) + NEW_TASKS), secs / 3600))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--tuning", type=Path, required=True, help="the tuning round's summary.json")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    tuning = {
        k: float(v["wall_seconds"]["median"])
        for k, v in json.loads(args.tuning.read_text())["variants"].items()
        if k in {s for s, _ in GRID.values()}
    }
    rows = estimate(wall_per_task(args.records), tuning)
    print("| stage | arm | runs | CPU hours |\n|---|---|---|---|")
    for stage, arm, runs, hours in rows:
        print(f"| {stage} | {arm} | {runs} | {hours:.1f} |")
    total, runs = sum(r[3] for r in rows), sum(r[2] for r in rows)
    by_stage: dict[str, float] = defaultdict(float)
    for r in rows:
        by_stage[r[0]] += r[3]
    stages = ", ".join(f"{s} {h:.1f}" for s, h in by_stage.items())
    print(
        f"\n{runs} runs, {total:.1f} CPU hours ({stages}); at least {total / args.jobs:.1f} "
        f"hours elapsed with --jobs {args.jobs}"
    )


if __name__ == "__main__":
    main()
