"""Where generated rollouts are wasted over training, per task: the share of each span's
generated rollouts that sit in groups whose rewards are all equal (zero advantage: no
gradient), against generated rollouts, one panel per task and one colour per variant (a
thin line per seed); with the replayed share of trained tokens dashed where a method
replays. Reads the per-step metrics (`step_metrics`) of the run records a suite's
`--results` writes:

    python benchmarks/waste_figure.py --records benchmarks/results/heldout/runs \\
        --tasks add6 sub6 sub5m2 add5m2h --variants grpo-p16 remix-grpo \\
        --out benchmarks/results/heldout/waste.png

It also prints, per task and variant, the median over seeds of the wasted share of all
generated rollouts and of each quarter of the run (records without per-step metrics are
listed and left out).

Records without per-step metrics (the block of 2026-12-04) still bound the waste at the
start: `--start-bound` prints, per task, a lower bound on the share of groups of G
completions with zero advantage before the first update, from the baseline's first
evaluation (the median over its seeds): a group of a prompt with success probability p is
all-wrong or all-right with probability (1 - p)^G + p^G, convex in p, so its mean over
prompts is at least its value at their mean accuracy (Jensen). The greedy evaluation's
accuracy stands in for the sampled one (an approximation, stated beside the figure):

    python benchmarks/waste_figure.py --records benchmarks/results/heldout/runs \
        --tasks add6 sub6 sub5m2 add5m2h --variants grpo-p16 --start-bound 8
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def wasted(steps: dict[str, list[Any]]) -> dict[str, Any]:
    """Generated rollouts in zero-advantage groups: in all, as a share, and the share in each
    quarter of the run's generated rollouts (a span counts in the quarter its end falls in).
    A span's rollouts are the rise of the cumulative count over it; its share the mean of its
    steps' zero-advantage fractions (groups are of one size, so groups' share = rollouts')."""
    cum = [float(x) for x in steps["rollouts_generated"]]
    made = [b - a for a, b in zip([0.0, *cum[:-1]], cum, strict=True)]
    zero = [0.0 if z is None else float(z) for z in steps["zero_advantage"]]
    lost = [m * z for m, z in zip(made, zero, strict=True)]
    total = sum(made)
    quarters = []
    for q in range(4):
        idx = [
            i for i, c in enumerate(cum) if q / 4 < c / total <= (q + 1) / 4 or (q == 0 and c == 0)
        ]
        gen = sum(made[i] for i in idx)
        quarters.append(sum(lost[i] for i in idx) / gen if gen else None)
    return {
        "generated": total,
        "wasted": sum(lost),
        "share": sum(lost) / total if total else None,
        "quarters": quarters,
    }


def start_bound(accuracy: float, group: int) -> float:
    """Lower bound on the share of zero-advantage groups of `group` completions at mean
    accuracy `accuracy` (Jensen on (1 - p)^G + p^G; see the module docstring)."""
    return (1 - accuracy) ** group + accuracy**group


def start_bounds(folder: Path, tasks: list[str], variant: str, group: int) -> str:
    """Markdown: per task, the median first-evaluation accuracy of `variant`'s records and
    the zero-advantage bound at it."""
    lines = [
        f"| task | first evaluation (median of {variant}'s seeds) | zero-advantage groups of "
        f"{group} at the start, at least |",
        "|---|---|---|",
    ]
    for task in tasks:
        firsts = []
        for path in sorted((folder / task).glob(f"{variant}-s*.json")):
            if path.stem.removeprefix(f"{variant}-s").isdigit():
                evals = json.loads(path.read_text()).get("evals") or []
                if evals:
                    firsts.append(float(evals[0]["eval/accuracy"]))
        if not firsts:
            lines.append(f"| {task} | - | - |")
            continue
        acc = statistics.median(firsts)
        lines.append(f"| {task} | {acc:.3f} | {start_bound(acc, group):.0%} |")
    return "\n".join(lines) + "\n"


def load(folder: Path, tasks: list[str], variants: list[str]) -> tuple[dict, list[str]]:
    """{task: {variant: [step_metrics per seed]}} and the records that have none."""
    out: dict[str, dict[str, list[dict[str, list[Any]]]]] = {}
    missing = []
    for task in tasks:
        for variant in variants:
            for path in sorted((folder / task).glob(f"{variant}-s*.json")):
                if not path.stem.removeprefix(f"{variant}-s").isdigit():
                    continue  # another variant whose name starts with this one's
                steps = json.loads(path.read_text()).get("step_metrics")
                if not steps or "zero_advantage" not in steps:
                    missing.append(str(path))
                    continue
                out.setdefault(task, {}).setdefault(variant, []).append(steps)
    return out, missing


def summary_table(runs: dict[str, dict[str, list[dict[str, list[Any]]]]]) -> str:
    """Markdown: per task and variant, medians over seeds of the wasted shares."""

    def med(xs: list[float | None]) -> str:
        vals = [x for x in xs if x is not None]
        return f"{statistics.median(vals):.2f}" if vals else "-"

    lines = [
        "| task | variant | seeds | wasted share of generated rollouts | 1st quarter | 2nd | "
        "3rd | 4th |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task, arms in runs.items():
        for variant, seeds in arms.items():
            w = [wasted(s) for s in seeds]
            qs = [med([x["quarters"][q] for x in w]) for q in range(4)]
            lines.append(
                f"| {task} | {variant} | {len(w)} | {med([x['share'] for x in w])} | "
                + " | ".join(qs)
                + " |"
            )
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, dict[str, list[dict[str, list[Any]]]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(runs)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.2), squeeze=False)
    colours: dict[str, Any] = {}
    for ax, task in zip(axes[0], tasks, strict=True):
        for variant, seeds in runs[task].items():
            colour = colours.setdefault(variant, f"C{len(colours)}")
            for i, s in enumerate(seeds):
                label = variant if i == 0 else None
                ax.plot(
                    s["rollouts_generated"],
                    s["zero_advantage"],
                    color=colour,
                    lw=0.8,
                    alpha=0.6,
                    label=label,
                )
                if any(x for x in s.get("replayed") or [] if x):
                    ax.plot(
                        s["rollouts_generated"],
                        s["replayed"],
                        color=colour,
                        lw=0.6,
                        ls="--",
                        alpha=0.5,
                    )
        ax.set_title(task)
        ax.set_xlabel("generated rollouts")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("zero-advantage share (dashed: replayed)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--out", type=Path, help="the figure (PNG); without it, the table only")
    p.add_argument("--start-bound", type=int, metavar="G", help="the start's bound, groups of G")
    args = p.parse_args(argv)
    if args.start_bound:
        for variant in args.variants:
            print(start_bounds(args.records, args.tasks, variant, args.start_bound), end="")
        return 0
    runs, missing = load(args.records, args.tasks, args.variants)
    if missing:
        print(f"{len(missing)} records without per-step metrics, left out: {missing[:3]} ...")
    if not runs:
        print("no records with per-step metrics")
        return 2
    print(summary_table(runs), end="")
    if args.out:
        plot(runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
