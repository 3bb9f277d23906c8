"""Generated rollouts each variant needs to first reach fixed accuracies (median over seeds).

    PYTHONPATH=src python benchmarks/rollouts_to.py TASK_FOLDER ACC [ACC ...]

TASK_FOLDER holds one suite task's runs (`<variant>-s<seed>/summary.json`, as `replayrl
bench` writes them). The suite table scores every variant against the baseline's median
final accuracy; near saturation that target is decided by one or two eval prompts, so this
reads the same runs at intermediate accuracies. Prints a markdown table; `never` counts as
infinite (the median of an unreached majority is `never`).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from replayrl.bench.suite import first_reaching, stats


def main(argv: list[str]) -> int:
    folder, targets = Path(argv[0]), [float(a) for a in argv[1:]]
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*-s*/summary.json")):
        variant = re.sub(r"-s\d+$", "", path.parent.name)
        runs[variant].append(json.loads(path.read_text()))
    print("| variant | seeds | " + " | ".join(f"rollouts to {t:g}" for t in targets) + " |")
    print("|---|---|" + "---|" * len(targets))
    for variant, summaries in runs.items():
        cells = []
        for t in targets:
            med = stats([first_reaching(s, t)["rollouts"] for s in summaries])["median"]
            cells.append("never" if math.isinf(med) else f"{med:.0f}")
        print(f"| {variant} | {len(summaries)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
