"""Mutation score from the last `mutmut run`: killed / total per module and overall.

A mutant no selected test covers ("no tests") counts as surviving, like any other survivor.
Usage: python scripts/mutation_score.py [--survivors]
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True
    ).stdout
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors = []
    for line in out.splitlines():
        if ":" not in line:
            continue
        name, status = (x.strip() for x in line.rsplit(":", 1))
        module = name.split(".x", 1)[0]
        by_module[module][status] += 1
        if status != "killed":
            survivors.append(f"{status}: {name}")
    total = Counter[str]()
    for module in sorted(by_module):
        c = by_module[module]
        n = sum(c.values())
        total.update(c)
        share = 100 * c["killed"] / n
        print(f"{module:<40} killed {c['killed']:>4} / {n:<4} ({share:5.1f}%)  {dict(c)}")
    n = sum(total.values())
    if not n:
        print("no mutants: run `mutmut run` first")
        return 1
    print(f"{'all':<40} killed {total['killed']:>4} / {n:<4} ({100 * total['killed'] / n:5.1f}%)")
    if "--survivors" in sys.argv:
        print("\n".join(survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
