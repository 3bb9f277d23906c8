"""Plot a finished multi-task suite's headline: generated rollouts to a share of the baseline's
gain, as a ratio to the baseline, per task and variant (lower is better).

Reads the `summary.json` that `replayrl bench suite SUITE --tasks ...` writes (per task, per
variant: `to_gain` medians over seeds) and draws one group of bars per variant, one bar per
task; a variant whose median seed never reaches the share gets a hatched bar at the top of
the axis, labelled "never". BENCHMARKS.md's held-out plot is this script's output:

    python benchmarks/plot_targets.py benchmarks/results/heldout/summary.json \
        --out benchmarks/results/heldout/rollouts_to_90.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def ratios(summary: dict[str, Any], share: str) -> dict[str, dict[str, float]]:
    """variant -> task -> median rollouts to `share` of the gain / the baseline's (inf: never)."""
    out: dict[str, dict[str, float]] = {}
    for task, block in summary["tasks"].items():
        base = block["variants"][block["baseline"]]["to_gain"][share]["rollouts"]["median"]
        for variant, v in block["variants"].items():
            mine = v.get("to_gain", {}).get(share, {}).get("rollouts", {}).get("median")
            ok = mine is not None and base and math.isfinite(mine) and math.isfinite(base)
            out.setdefault(variant, {})[task] = mine / base if ok else math.inf
    return out


def plot(table: dict[str, dict[str, float]], share: str, out: Path, skip: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in table if v not in skip]
    tasks = sorted({t for row in table.values() for t in row})
    finite = [r for v in variants for r in table[v].values() if math.isfinite(r)]
    top = max(finite + [1.0]) * 1.15
    width = 0.8 / max(len(tasks), 1)
    fig, ax = plt.subplots(figsize=(1.1 * len(variants) + 2, 4))
    for i, task in enumerate(tasks):
        xs = [j + (i - (len(tasks) - 1) / 2) * width for j in range(len(variants))]
        vals = [table[v].get(task, math.inf) for v in variants]
        heights = [r if math.isfinite(r) else top for r in vals]
        bars = ax.bar(xs, heights, width, label=task)
        for bar, r in zip(bars, vals, strict=True):
            if not math.isfinite(r):
                bar.set_hatch("//")
                bar.set_alpha(0.4)
                ax.text(
                    bar.get_x() + width / 2,
                    top,
                    "never",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
    ax.set_ylim(0, top * 1.25)
    ax.set_ylabel(f"rollouts to {float(share):.0%} of gain / baseline's")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, help="a multi-task suite's summary.json")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--share", default="0.9", help="share of the gain (a key of to_gain)")
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    args = parser.parse_args(argv)
    table = ratios(json.loads(args.summary.read_text()), args.share)
    plot(table, args.share, args.out, args.skip)
    for variant, row in table.items():
        print(variant, {t: round(r, 2) for t, r in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
