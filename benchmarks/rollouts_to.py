"""Generated rollouts each variant needs to first reach fixed accuracies (median over seeds).

    PYTHONPATH=src python benchmarks/rollouts_to.py TASK_FOLDER ACC [ACC ...]
    PYTHONPATH=src python benchmarks/rollouts_to.py TASK_FOLDER --gain 0.5 0.8 0.9 0.95

TASK_FOLDER holds one suite task's runs (`<variant>-s<seed>/summary.json`, as `replayrl
bench` writes them). The suite table scores every variant against the baseline's median
final accuracy and, below the plateau, against fractions of the baseline's median gain;
this reads the same runs at any accuracies: absolute ones, or with `--gain` fractions f of
the baseline's gain (target = start + f x (final - start), medians over the baseline's
seeds; `--baseline`, default grpo). Prints a markdown table; `never` counts as infinite
(the median of an unreached majority is `never`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from replayrl.bench.suite import first_reaching, stats
from replayrl.bench.targets import gain_targets


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("targets", type=float, nargs="+")
    p.add_argument("--gain", action="store_true", help="targets are fractions of the gain")
    p.add_argument("--baseline", default="grpo")
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(args.folder.glob("*-s*/summary.json")):
        variant = re.sub(r"-s\d+$", "", path.parent.name)
        runs[variant].append(json.loads(path.read_text()))
    accs, labels = args.targets, [f"{t:g}" for t in args.targets]
    if args.gain:
        if args.baseline not in runs:
            print(f"no runs of the baseline {args.baseline!r} in {args.folder}", file=sys.stderr)
            return 2
        g = gain_targets(runs[args.baseline])
        accs = [g["start"] + f * g["gain"] for f in args.targets]
        labels = [f"{f:.0%} gain ({a:.3f})" for f, a in zip(args.targets, accs, strict=True)]
        print(f"{args.baseline}: start {g['start']:.3f} -> final {g['final']:.3f}\n")
    print("| variant | seeds | " + " | ".join(f"rollouts to {t}" for t in labels) + " |")
    print("|---|---|" + "---|" * len(accs))
    for variant, summaries in runs.items():
        cells = []
        for t in accs:
            med = stats([first_reaching(s, t)["rollouts"] for s in summaries])["median"]
            cells.append("never" if math.isinf(med) else f"{med:.0f}")
        print(f"| {variant} | {len(summaries)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
