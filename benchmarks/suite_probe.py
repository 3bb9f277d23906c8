"""One run of a suite variant with extra overrides, resolved exactly as `replayrl bench` does
(a tuning probe that leaves the suite's own runs and baseline alone).

Usage: PYTHONPATH=src python benchmarks/suite_probe.py SUITE TASK VARIANT SEED NAME KEY=VALUE...
Writes runs/probe/SUITE/TASK/NAME-sSEED and prints the eval curve (generated rollouts, acc).
"""

from __future__ import annotations

import sys
from pathlib import Path

from replayrl.bench.suite import load_suite, run_one, variant_config


def main(argv: list[str]) -> int:
    suite_name, task, variant, seed, name, *extra = argv
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
