"""The evidence table over committed per-run records, for arms that ran outside a suite (TRL's
`GRPOTrainer` beside our GRPO): each task's arms against a baseline, and over the tasks, with
the suite's own intervals, take-off rates, block check and claims (bench/evidence.py).

    python benchmarks/records_table.py --baseline grpo-p16 --seeds 0 1 2 3 4 \\
        --tasks add6 sub6 sub5m2 add5m2h \\
        --arms benchmarks/results/heldout/runs:grpo-p16 benchmarks/results/heldout/trl-peer:trl-grpo

Each of `--arms` (`FOLDER:VARIANT`, the baseline's included) reads
`FOLDER/<task>/<VARIANT>-s<seed>.json`, the records a suite's `--results` and
`bench.evidence.write_run_record` write. A missing or unreadable record is an error naming
it, not a smaller table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from replayrl.bench.evidence import (
    across_tasks,
    check_blocks,
    evidence_table,
    run_record_path,
    task_evidence,
)
from replayrl.config.schema import ConfigError


def load_arms(
    arms: list[tuple[Path, str]], tasks: list[str], seeds: list[int]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{task: {variant: [record per seed]}}; ConfigError listing every missing or unreadable
    record and every record whose own task, variant or seed is not the one its file name
    says. A seed, task or variant given twice is refused: it would count the same runs twice."""
    named = {"seed": [str(s) for s in seeds], "task": tasks, "variant": [v for _, v in arms]}
    for what, items in named.items():
        repeated = sorted({x for x in items if items.count(x) > 1})
        if repeated:
            raise ConfigError(f"{what} given more than once: {', '.join(repeated)}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {} for t in tasks}
    problems = []
    for task in tasks:
        for folder, variant in arms:
            for seed in seeds:
                path = run_record_path(folder, task, variant, seed)
                if not path.is_file():
                    problems.append(f"{path}: missing")
                    continue
                try:
                    record = json.loads(path.read_text())
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    problems.append(f"{path}: not a JSON record ({err})")
                    continue
                if not isinstance(record, dict):
                    problems.append(f"{path}: not a JSON record (a {type(record).__name__})")
                    continue
                own = (record.get("task"), record.get("variant"), record.get("seed"))
                if own != (task, variant, seed):
                    problems.append(f"{path}: the record is task, variant, seed {own}")
                    continue
                runs[task].setdefault(variant, []).append(record)
    if problems:
        raise ConfigError("run records that cannot be used:\n  " + "\n  ".join(problems))
    return runs


def records_table(
    runs: dict[str, dict[str, list[dict[str, Any]]]], baseline: str, mixed: bool = False
) -> str:
    """Markdown: the evidence table of `runs` against `baseline` (refuses mixed blocks)."""
    blocks = check_blocks(runs, mixed)
    per_task = {t: task_evidence(results, baseline) for t, results in runs.items()}
    over = across_tasks(per_task, runs, baseline) if len(per_task) > 1 else {}
    return evidence_table(per_task, over, baseline, blocks)


def _arm(text: str) -> tuple[Path, str]:
    folder, sep, variant = text.rpartition(":")
    if not sep or not folder or not variant:
        raise argparse.ArgumentTypeError(f"expected FOLDER:VARIANT, got {text!r}")
    return Path(folder), variant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arms", nargs="+", type=_arm, required=True, help="FOLDER:VARIANT, the baseline's too"
    )
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--mixed", action="store_true", help="label rows by block instead")
    args = parser.parse_args(argv)
    if args.baseline not in {v for _, v in args.arms}:
        parser.error(f"the baseline {args.baseline!r} is not one of the arms")
    try:
        runs = load_arms(args.arms, args.tasks, args.seeds)
        print(records_table(runs, args.baseline, args.mixed))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
