"""How far one method's over-task interval moves with the bootstrap's own seed, at each
resampling level (tasks then seeds; seeds within the tasks), from a block's records; and its
upper end at a Holm level (one-sided 5% / m, the first level a family of m tests at).

    python benchmarks/interval_stability.py --records benchmarks/results/heldout/runs \\
        --baseline grpo-p16 --method remix-grpo --tasks add6 sub6 sub5m2 add5m2h \\
        --bootstrap-seeds 20 --family 7
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

import numpy as np

from replayrl.bench.claims import ALPHA
from replayrl.bench.intervals import LEVEL, RESAMPLING, ends, ratio_over_tasks_distribution
from replayrl.bench.robust import curve


def _load_records():
    path = Path(__file__).with_name("headline_table.py")
    spec = importlib.util.spec_from_file_location("headline_table", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--baseline", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--bootstrap-seeds", type=int, default=20)
    p.add_argument("--family", type=int, default=1, help="m, the methods Holm controls over")
    args = p.parse_args(argv)
    runs = _load_records()(args.records, args.tasks, [args.baseline, args.method])
    pairs = [
        ([curve(s) for s in runs[t][args.method]], [curve(s) for s in runs[t][args.baseline]])
        for t in args.tasks
    ]
    budgets = [
        statistics.median(float(s["rollouts_generated"]) for s in runs[t][args.baseline])
        for t in args.tasks
    ]
    for level in RESAMPLING:
        highs = []
        for seed in range(args.bootstrap_seeds):
            _, dist = ratio_over_tasks_distribution(pairs, budgets, seed=seed, resampling=level)
            highs.append(ends(dist, LEVEL)[1])
        _, dist = ratio_over_tasks_distribution(pairs, budgets, seed=0, resampling=level)
        holm_first = float(np.quantile(dist, 1 - ALPHA / args.family, method="inverted_cdf"))
        print(
            f"{level}: {LEVEL:.0%} upper end {min(highs):.3f}-{max(highs):.3f} over "
            f"{args.bootstrap_seeds} bootstrap seeds; one-sided {ALPHA:.0%} / {args.family} "
            f"upper end {holm_first:.3f} (bootstrap seed 0)"
        )


if __name__ == "__main__":
    main()
