"""One run of a suite variant with extra overrides, resolved exactly as `replayrl bench` does
(a tuning probe that leaves the suite's own runs and baseline alone): to try a setting on
one seed before adding it to a suite.

Usage: PYTHONPATH=src python benchmarks/suite_probe.py SUITE TASK VARIANT SEED NAME KEY=VALUE...
Writes runs/probe/SUITE/TASK/NAME-sSEED and prints the eval curve (generated rollouts, acc).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from replayrl.bench.suite import load_suite, run_one, variant_config


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suite", help="suite name or YAML path")
    parser.add_argument("task", help="the suite's task (as in --tasks)")
    parser.add_argument("variant", help="the suite variant to start from")
    parser.add_argument("seed", type=int, help="the run's seed")
    parser.add_argument("name", help="name of the probe run")
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides")
    args = parser.parse_args(argv)
    suite_name, task, variant, seed, name = (
        args.suite,
        args.task,
        args.variant,
        args.seed,
        args.name,
    )
    extra = args.overrides
    suite = load_suite(suite_name)
    base = suite["variants"][variant]
    suite["variants"][name] = {**base, "overrides": [*base.get("overrides", []), *extra]}
    out = Path("runs/probe") / suite["name"] / task
    cfg = variant_config(suite, name, int(seed), out, False, task)
    s = run_one(cfg, base.get("peer"), out / f"{name}-s{seed}", log=lambda _: None)
    print(
        f"{task} {name} s{seed}: final {s['final_eval_accuracy']}, rollouts "
        f"{s['rollouts_generated']}"
    )
    for e in s["evals"]:
        print(f"  {e.get('rollouts_generated')}\t{e['eval/accuracy']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
