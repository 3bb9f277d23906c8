"""Replay vs on-policy GRPO on the demo task: generated rollouts needed to reach a target.

Runs each variant for each seed (one after another, same warm start, same eval prompts),
then reports, per variant, the median and IQR over seeds of: rollouts generated until eval
accuracy first reaches the target (default: the on-policy runs' median final accuracy),
final accuracy, final training entropy, and wall seconds to target.

Usage: python benchmarks/replay_vs_onpolicy.py [--seeds 0 1 2] [--out runs/bench/replay]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from replayrl.config import load_config
from replayrl.metrics import read_metrics
from replayrl.runner import train

COMMON = ["eval.every=5", "logging.progress=false", "logging.tensorboard=false",
          "logging.overwrite=true", "checkpoint.every=0"]
VARIANTS = {
    # the baseline: 16 prompts x 8 = 128 fresh rollouts per step, each used once
    "onpolicy": ["train.steps=80"],
    # replay: 4 prompts x 8 = 32 fresh rollouts per step into a FIFO of 256 (x = N/R = 8),
    # batches of B = 128 sampled uniformly without removal (y = B/R = 4 uses per rollout)
    "replay": ["rollout.prompts_per_step=4", "buffer.kind=replay", "buffer.capacity=256",
               "train.batch_size=128", "train.steps=160"],
}


def rollouts_to_target(summary: dict, target: float) -> tuple[float, float]:
    """(rollouts, wall seconds) at the first eval reaching `target`; inf if never."""
    for e in summary["evals"]:
        if e["eval/accuracy"] >= target - 1e-9:
            return float(e["rollouts_generated"]), float(e["wall_seconds"])
    return float("inf"), float("inf")


def med_iqr(xs: list[float]) -> str:
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return f"{med:.4g} [{q1:.4g}, {q3:.4g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/bench/replay")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = ap.parse_args()
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    for variant in args.variants:
        for seed in args.seeds:
            overrides = [*COMMON, *VARIANTS[variant], f"train.seed={seed}",
                         f"logging.run_dir={args.out}", f"logging.name={variant}-s{seed}"]
            summary = train(load_config(args.config, overrides), log=lambda _: None)
            run_dir = Path(args.out) / f"{variant}-s{seed}"
            last = [m for m in read_metrics(run_dir / "metrics.jsonl") if "train/entropy" in m]
            summary["final_entropy"] = last[-1]["train/entropy"] if last else float("nan")
            results[variant].append(summary)
            print(f"{variant} seed {seed}: final acc {summary['final_eval_accuracy']:.3f}, "
                  f"rollouts {summary['rollouts_generated']}", flush=True)
    target = statistics.median(s["final_eval_accuracy"] for s in results["onpolicy"])
    rows = {}
    print(f"\ntarget accuracy (on-policy median final): {target:.3f}\n")
    print("| variant | rollouts to target | wall s to target | final acc | best acc | "
          "final entropy | rollouts total |")
    print("|---|---|---|---|---|---|---|")
    for variant, runs in results.items():
        to_t = [rollouts_to_target(s, target) for s in runs]
        rows[variant] = {
            "rollouts_to_target": [r for r, _ in to_t],
            "wall_to_target": [w for _, w in to_t],
            "final_eval_accuracy": [s["final_eval_accuracy"] for s in runs],
            "best_eval_accuracy": [s["best_eval_accuracy"] for s in runs],
            "final_entropy": [s["final_entropy"] for s in runs],
            "rollouts_generated": [s["rollouts_generated"] for s in runs],
        }
        r = rows[variant]
        print(f"| {variant} | {med_iqr(r['rollouts_to_target'])} | "
              f"{med_iqr(r['wall_to_target'])} | {med_iqr(r['final_eval_accuracy'])} | "
              f"{med_iqr(r['best_eval_accuracy'])} | {med_iqr(r['final_entropy'])} | "
              f"{med_iqr(r['rollouts_generated'])} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(
        json.dumps({"target": target, "seeds": args.seeds, "variants": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
