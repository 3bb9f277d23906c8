"""RePO's held-out runs against the committed GRPO rows (benchmarks/results/heldout/<task>/
summary.json), with the bench's own measures (replayrl.bench.targets): final accuracy, AUC
over GRPO's horizon, generated rollouts to 90% of GRPO's median gain, non-inferiority.

GRPO's per-seed curves are not committed, only its summary; sync runs are deterministic for
a seed, so rerunning GRPO would give the same rows. Usage (from the repository root):
    python benchmarks/results/heldout/repo/compare.py runs/bench-repo/heldout > table.md
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from replayrl.bench.targets import area_under_curve, cost_to, non_inferior, stats

HERE = Path(__file__).resolve().parent
TASKS = ("add6", "sub6", "sub5m2")


def num(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.3g}"


def fmt(s: dict) -> str:
    """median [q25, q75]"""
    return f"{num(s['median'])} [{num(s['q25'])}, {num(s['q75'])}]" if s["n"] else "n/a"


def main(runs_root: Path) -> int:
    print(
        "| task | variant | seeds | final acc | AUC | reached 90% of GRPO's gain | "
        "rollouts to 90% gain (ratio to GRPO) | rollouts reused / generated | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for task in TASKS:
        grpo = json.loads((HERE.parent / task / "summary.json").read_text())["variants"]["grpo"]
        found = sorted(runs_root.glob(f"{task}/repo-s*/summary.json"))
        runs = [json.loads(p.read_text()) for p in found]
        cell = grpo["to_gain"]["0.9"]
        print(
            f"| {task} | grpo (committed) | {grpo['final_eval_accuracy']['n']} | "
            f"{fmt(grpo['final_eval_accuracy'])} | {fmt(grpo['auc'])} | "
            f"{cell['reached']}/{grpo['final_eval_accuracy']['n']} | "
            f"{fmt(cell['rollouts'])} (1.00) | 0 | - |"
        )
        if not runs:
            print(f"| {task} | repo | 0 | not run | | | | | |")
            continue
        reach = [cost_to(s, cell["accuracy"], None)["rollouts"] for s in runs]
        r = stats(reach)
        final = stats([s["final_eval_accuracy"] for s in runs])
        auc = stats([area_under_curve(s, grpo["auc_horizon"]) for s in runs])
        ratio = r["median"] / cell["rollouts"]["median"]
        reused = sum(s["rollouts_reused"] for s in runs) / sum(
            s["rollouts_generated"] for s in runs
        )
        ok = "non-inferior" if non_inferior(final["median"], grpo["final"]) else "INFERIOR"
        reached = sum(x != float("inf") for x in reach)
        print(
            f"| {task} | repo | {len(runs)} | {fmt(final)} | {fmt(auc)} | {reached}/{len(runs)} "
            f"| {fmt(r)} ({ratio:.2f}) | {reused:.2f} | {ok} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
