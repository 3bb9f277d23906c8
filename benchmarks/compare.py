"""Side-by-side runs of presets x seeds on the demo task: rollouts needed to reach a target.

Each variant is a preset from configs/ (plus optional overrides), run for each seed one after
another with the same warm start, reward and eval prompts. The target accuracy is the first
(baseline) variant's median final eval accuracy. Reported per variant, as median [IQR] over
seeds: generated rollouts and wall seconds until eval accuracy first reaches the target (inf
if never), final and best accuracy, final training entropy, total rollouts, and the ratio of
rollouts-to-target against the baseline.

Usage:
  python benchmarks/compare.py grpo replay --seeds 0 1 2 --out runs/bench/compare
  python benchmarks/compare.py grpo remix-grpo --set remix-grpo:rollout.prompts_per_step=4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np

from replayrl.config import load_config
from replayrl.metrics import read_metrics
from replayrl.runner import train

COMMON = [
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.overwrite=true",
    "checkpoint.every=0",
]


def first_reaching(summary: dict, target: float) -> tuple[float, float]:
    """(rollouts, wall seconds) at the first eval with accuracy >= target; inf if never."""
    for e in summary["evals"]:
        if e["eval/accuracy"] >= target - 1e-9:
            return float(e["rollouts_generated"]), float(e["wall_seconds"])
    return math.inf, math.inf


def med_iqr(xs: list[float]) -> str:
    if any(math.isinf(x) for x in xs):
        finite = sorted(xs)
        med = finite[len(finite) // 2]
        return f"{med:.4g} ({sum(math.isinf(x) for x in xs)}/{len(xs)} never)"
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return f"{med:.4g} [{q1:.4g}, {q3:.4g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "variants", nargs="+", help="preset names in configs/; the first is the baseline"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/bench/compare")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="VARIANT:KEY=VALUE",
        help="an override for one variant (repeatable)",
    )
    args = ap.parse_args()
    extra: dict[str, list[str]] = {v: [] for v in args.variants}
    for item in args.set:
        name, _, override = item.partition(":")
        extra[name].append(override)
    results: dict[str, list[dict]] = {}
    for variant in args.variants:
        results[variant] = []
        for seed in args.seeds:
            name = f"{variant}-s{seed}"
            overrides = [
                *COMMON,
                *extra[variant],
                f"train.seed={seed}",
                f"logging.run_dir={args.out}",
                f"logging.name={name}",
            ]
            summary = train(load_config(f"configs/{variant}.yaml", overrides), log=lambda _: None)
            rows = read_metrics(Path(args.out) / name / "metrics.jsonl")
            ent = [m["train/entropy"] for m in rows if m.get("train/entropy") is not None]
            summary["final_entropy"] = ent[-1] if ent else math.nan
            results[variant].append(summary)
            print(
                f"{name}: final acc {summary['final_eval_accuracy']:.3f}, "
                f"rollouts {summary['rollouts_generated']}, wall {summary['wall_seconds']:.0f}s",
                flush=True,
            )
    base = args.variants[0]
    target = statistics.median(s["final_eval_accuracy"] for s in results[base])
    base_to_target = statistics.median(first_reaching(s, target)[0] for s in results[base])
    table = {}
    print(
        f"\ntarget: {target:.3f} = median final eval accuracy of {base} ({len(args.seeds)} seeds)\n"
    )
    print(
        "| variant | rollouts to target | x fewer than baseline | wall s to target | "
        "final acc | best acc | final entropy | rollouts total |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant, runs in results.items():
        reach = [first_reaching(s, target) for s in runs]
        r = {
            "rollouts_to_target": [x for x, _ in reach],
            "wall_to_target": [w for _, w in reach],
            "final_eval_accuracy": [s["final_eval_accuracy"] for s in runs],
            "best_eval_accuracy": [s["best_eval_accuracy"] for s in runs],
            "final_entropy": [s["final_entropy"] for s in runs],
            "rollouts_generated": [s["rollouts_generated"] for s in runs],
        }
        med = statistics.median(r["rollouts_to_target"])
        r["fewer_rollouts_than_baseline"] = base_to_target / med if med else math.nan
        table[variant] = r
        print(
            f"| {variant} | {med_iqr(r['rollouts_to_target'])} | "
            f"{r['fewer_rollouts_than_baseline']:.2f} | {med_iqr(r['wall_to_target'])} | "
            f"{med_iqr(r['final_eval_accuracy'])} | {med_iqr(r['best_eval_accuracy'])} | "
            f"{med_iqr(r['final_entropy'])} | {med_iqr(r['rollouts_generated'])} |"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(
        json.dumps(
            {
                "target": target,
                "baseline": base,
                "seeds": args.seeds,
                "variants": table,
                "overrides": extra,
            },
            indent=2,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
