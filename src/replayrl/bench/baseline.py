"""The baseline every method is compared to: the strongest of the baseline method's settings
on the tuning task, all at the same generated budget, chosen by a stated rule.

A suite names the candidates and the committed tuning summary to choose from:

    baseline: grpo-p16              # the choice the tuning results give (checked)
    baseline_choice:
      tuning_results: benchmarks/results/tuning/remix-fair/summary.json
      settings: {grpo.lr1e-4: grpo-p16, grpo.p8: grpo-p8, grpo.utd4: grpo-utd4}

Rule (`STRONGEST`): the fewest median generated rollouts to 90% of the tuning baseline's
gain (the claimed metric) among the settings whose median final accuracy (mean of each run's
last 3 evals) is within a guard of the best one's: `MARGIN` (0.01) unless the suite sets
`baseline_choice.guard` (the next block's grid: 0.02, the no-loss margin, since a guard
inside one evaluation's binomial error rejects settings on noise). The other settings stay
in the suite as controls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replayrl.bench.targets import MARGIN, tuning_choice
from replayrl.config.schema import ConfigError

STRONGEST = (
    "the strongest of {n} GRPO settings on the tuning task at the same budget: fewest "
    "rollouts to 90% of the gain among those whose median final (mean of the last 3 evals) "
    "is within {guard:g} of the best"
)


def strongest(
    tuning_variants: dict[str, dict[str, Any]], settings: list[str], guard: float = MARGIN
) -> str:
    """The tuning variant among `settings` that the rule picks (ConfigError when one of them
    is missing from the tuning results)."""
    missing = [s for s in settings if s not in tuning_variants]
    if missing:
        raise ConfigError(f"baseline_choice: the tuning results have no {missing}")
    rows = {s: tuning_variants[s] for s in settings}
    # tuning_choice groups by the name before the first `.`: one group, the same rule
    picked = tuning_choice({f"x.{s}": r for s, r in rows.items()}, guard)["x"]["setting"]
    return picked.removeprefix("x.")


def find_results(path: str, suite_file: Path) -> Path | None:
    """`path` as given (from the current folder), else under the repository that holds the
    suite file (a source checkout); None when neither exists."""
    direct = Path(path)
    if direct.is_file():
        return direct
    for parent in suite_file.resolve().parents:
        if (parent / path).is_file():
            return parent / path
    return None


def choose_baseline(suite: dict[str, Any], log: Any = None) -> dict[str, Any]:
    """Set `suite["baseline"]` by the rule when the tuning results are at hand (and refuse a
    `baseline:` that disagrees with them); without them keep the suite's `baseline:`."""
    choice = suite.get("baseline_choice")
    if not choice:
        return suite
    settings: dict[str, str] = choice.get("settings") or {}
    if len(settings) < 3 or any(v not in suite["variants"] for v in settings.values()):
        raise ConfigError(
            "baseline_choice.settings must map at least 3 tuning settings to variants of the "
            f"suite, got {settings}"
        )
    guard = float(choice.get("guard", MARGIN))
    rule = STRONGEST.format(n=len(settings), guard=guard)
    found = find_results(str(choice.get("tuning_results", "")), Path(suite["path"]))
    if found is None:
        if log is not None:
            log(f"baseline {suite['baseline']!r}: tuning results not found, as the suite says")
        suite["baseline_rule"] = rule
        return suite
    tuning = json.loads(found.read_text())
    picked = settings[strongest(tuning["variants"], list(settings), guard)]
    if suite.get("baseline_stated") and suite["baseline"] != picked:
        raise ConfigError(
            f"baseline {suite['baseline']!r} disagrees with the rule on {found}, which picks "
            f"{picked!r} ({rule}): update the suite's `baseline:`"
        )
    suite["baseline"], suite["baseline_rule"] = picked, rule
    return suite
