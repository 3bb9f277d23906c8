"""Mutation score from the last `mutmut run`: killed / total per module and overall.

A mutant no selected test covers ("no tests") counts as surviving, like any other survivor.
A run stopped part-way leaves mutants "not checked": they are listed per module and left out
of that module's score (the score is then over the mutants checked so far, and says so).
`--names=FILE` scores only the mutants named in FILE (one per line): a random sample of a
scope too slow to run whole, with Wilson's 95% interval for the scope's score.
Usage: python scripts/mutation_score.py [--survivors] [--names=FILE] [MODULE_PREFIX ...]
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path


def _line(module: str, c: Counter[str]) -> str:
    """killed / checked (and the share), with the not-checked count when a run stopped early."""
    checked = sum(c.values()) - c["not checked"]
    share = 100 * c["killed"] / checked if checked else float("nan")
    rest = f"  not checked {c['not checked']}" if c["not checked"] else ""
    detail = {k: v for k, v in c.items() if k != "not checked"}
    return f"{module:<40} killed {c['killed']:>4} / {checked:<4} ({share:5.1f}%){rest}  {detail}"


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval (in %) for a kill rate of killed / n sampled mutants."""
    p, den = killed / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / den
    return 100 * (centre - half), 100 * (centre + half)


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True
    ).stdout
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors = []
    prefixes = [a for a in sys.argv[1:] if not a.startswith("--")]
    files = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--names=")]
    names = {n.strip() for f in files for n in Path(f).read_text().split() if n.strip()}
    for line in out.splitlines():
        if ":" not in line:
            continue
        name, status = (x.strip() for x in line.rsplit(":", 1))
        if prefixes and not any(name.startswith(p) for p in prefixes):
            continue
        if names and name not in names:
            continue
        module = name.split(".x", 1)[0]
        by_module[module][status] += 1
        if status not in ("killed", "not checked"):
            survivors.append(f"{status}: {name}")
    total = Counter[str]()
    for module in sorted(by_module):
        c = by_module[module]
        total.update(c)
        print(_line(module, c))
    if not sum(total.values()) - total["not checked"]:
        print("no mutants checked: run `mutmut run` first")
        return 1
    print(_line("all", total))
    checked = sum(total.values()) - total["not checked"]
    if names:
        lo, hi = wilson(total["killed"], checked)
        print(f"sample of {len(names)} named: Wilson 95% interval {lo:.1f}-{hi:.1f}%")
    if "--survivors" in sys.argv:
        print("\n".join(survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
