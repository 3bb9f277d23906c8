"""The reasoning suite's `replay` variant at other buffer capacities.

    PYTHONPATH=src python benchmarks/buffer_sizes.py OUT TASK SEED CAPACITY [CAPACITY ...]

Each run is resolved exactly as `replayrl bench reasoning` resolves the suite's `replay` run
(`bench.variant_config`: the suite's and the task's overrides, the common eval grid, the seed)
plus `buffer.capacity=CAPACITY`, and written to OUT/TASK/replay-capN-sSEED/. Runs go one
after another; a finished run of exactly this config is skipped. Compare them with the suite's
own replay run (`benchmarks/findings.py`).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from replayrl.bench.suite import finished_run, load_suite, run_one, variant_config


def capacity_variant(suite: dict, capacity: int) -> tuple[dict, str]:
    """A copy of `suite` with a `replay-capN` variant: the `replay` variant plus the capacity."""
    suite = copy.deepcopy(suite)
    base = suite["variants"]["replay"]
    name = f"replay-cap{capacity}"
    suite["variants"][name] = {
        **base,
        "overrides": [*base.get("overrides", []), f"buffer.capacity={capacity}"],
    }
    return suite, name


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="root folder of the runs")
    parser.add_argument("task", help="a task of the reasoning suite (add, sub, chain)")
    parser.add_argument("seed", type=int, help="the run's seed")
    parser.add_argument("capacities", type=int, nargs="+", help="buffer capacities N to run")
    args = parser.parse_args(argv)
    out, task, seed, caps = args.out, args.task, args.seed, args.capacities
    for cap in caps:
        suite, name = capacity_variant(load_suite("reasoning"), cap)
        cfg = variant_config(suite, name, seed, out / task, False, task)
        run_dir = out / task / f"{name}-s{seed}"
        if finished_run(cfg, run_dir) is not None:
            print(name, seed, "already done", flush=True)
            continue
        s = run_one(cfg, None, run_dir, log=lambda m: None)
        print(name, seed, "final", s["final_eval_accuracy"], "wall", round(s["wall_seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
