"""How often the suite's 90% interval for a final difference (bench/intervals.py,
`final_difference_interval`: scipy's percentile bootstrap) contains the true difference, on
simulated seeds: both arms drawn from one normal distribution (true difference 0), `n` runs
each. A percentile bootstrap is known to be narrow on few samples; this measures how narrow
at the seed counts the held-out block uses.

    python benchmarks/bootstrap_coverage.py --seeds 5 10 --trials 1000
"""

from __future__ import annotations

import argparse

import numpy as np

from replayrl.bench.intervals import LEVEL, final_difference_interval


def coverage(n: int, trials: int, sd: float, seed: int) -> float:
    """Share of `trials` simulated comparisons (n runs an arm) whose interval contains 0."""
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(trials):
        variant, baseline = rng.normal(0.0, sd, n), rng.normal(0.0, sd, n)
        d = final_difference_interval(list(variant), list(baseline), seed=i)
        hits += d["low"] <= 0.0 <= d["high"]
    return hits / trials


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[5, 10], help="runs per arm")
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--sd", type=float, default=0.03, help="spread of a run's final accuracy")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for n in a.seeds:
        c = coverage(n, a.trials, a.sd, a.seed)
        half = 1.96 * (c * (1 - c) / a.trials) ** 0.5
        print(f"{n} runs an arm: nominal {LEVEL:.0%}, covered {c:.3f} (+/- {half:.3f})")


if __name__ == "__main__":
    main()
