"""Is one group of runs' final accuracy below another's beyond seed noise? A rank-sum
permutation test on the final evaluation and on the mean of the last ten evaluations.

    python benchmarks/final_gap.py --a RUN_DIR ... --b RUN_DIR ... [--draws 50000]

Each RUN_DIR is a run folder (its metrics.jsonl). Prints each group's median, the rank-sum
statistic U (pairs where a beats b, ties half) and permutation p-values: two-sided, and
one-sided for "b below a". Used for `auto`'s gap on `sub` (BENCHMARKS.md "`auto` checked
against its own noise": a = GRPO seeds 0-9, b = the warm-up runs).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path


def evaluations(run: Path) -> list[float]:
    rows = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    return [float(r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]


def rank_sum(a: list[float], b: list[float]) -> float:
    """U: pairs (x in a, y in b) with x > y, ties counted half."""
    return sum((x > y) + 0.5 * (x == y) for x in a for y in b)


def permutation_p(a: list[float], b: list[float], draws: int, seed: int = 0) -> tuple[float, float]:
    """(two-sided, one-sided "b below a") p of U under random relabelling of the runs."""
    observed, centre = rank_sum(a, b), len(a) * len(b) / 2
    pool, k, rng = a + b, len(a), random.Random(seed)
    two = one = 0
    for _ in range(draws):
        rng.shuffle(pool)
        u = rank_sum(pool[:k], pool[k:])
        two += abs(u - centre) >= abs(observed - centre) - 1e-12
        one += u >= observed - 1e-12
    return two / draws, one / draws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs="+", type=Path, required=True, help="run folders, group a")
    ap.add_argument("--b", nargs="+", type=Path, required=True, help="run folders, group b")
    ap.add_argument("--draws", type=int, default=50_000)
    args = ap.parse_args()
    curves = {name: [evaluations(r) for r in runs] for name, runs in (("a", args.a), ("b", args.b))}
    for label, pick in (
        ("final", lambda e: e[-1]),
        ("mean of last 10", lambda e: sum(e[-10:]) / len(e[-10:])),
    ):
        a = [pick(e) for e in curves["a"]]
        b = [pick(e) for e in curves["b"]]
        two, one = permutation_p(a, b, args.draws)
        print(
            f"{label}: a median {statistics.median(a):.3f} ({len(a)} runs), b median "
            f"{statistics.median(b):.3f} ({len(b)} runs), U = {rank_sum(a, b):g}, "
            f"p two-sided {two:.3f}, one-sided (b below a) {one:.3f}"
        )


if __name__ == "__main__":
    main()
