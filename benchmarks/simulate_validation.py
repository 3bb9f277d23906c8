"""The discrete-event model (`replayrl simulate`) against real asynchronous runs on this machine.

    python benchmarks/simulate_validation.py OUT_DIR [--steps 40] [--only NAME ...]

Each configuration trains for real (the demo task, 1 torch thread per role), then the model
is given that run's own roles, sizes and measured costs (`replayrl simulate --from-run`) and
predicts its seconds per step and the quantiles of its steps' mean batch age. Prints a
markdown table of predicted vs measured with the gap, and writes OUT_DIR/validation.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from replayrl.cli.simulate import measured, predicted, spec_from_run

COMMON = [
    "eval.every=0",
    "train.threads=1",
    "workers.generator_threads=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.overwrite=true",
    "logging.completions=0",
]

CASES: dict[str, tuple[str, list[str]]] = {
    "replay-local-w1": ("replay", ["runtime=async-local", "workers.generators=1"]),
    "replay-local-w2": ("replay", ["runtime=async-local", "workers.generators=2"]),
    "grpo-local-w1": ("grpo", ["runtime=async-local", "workers.generators=1"]),
    "grpo-local-w2": ("grpo", ["runtime=async-local", "workers.generators=2"]),
    "replay-ray-w1": ("replay", ["runtime=ray", "workers.generators=1", "ray.num_cpus=2"]),
    "replay-ray-w2": ("replay", ["runtime=ray", "workers.generators=2", "ray.num_cpus=3"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (preset, overrides) in CASES.items():
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, "-m", "replayrl.cli.main", "train", "--config", preset]
        cmd += [*COMMON, *overrides, f"train.steps={args.steps}"]
        cmd += [f"logging.run_dir={args.out}", f"logging.name={name}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: the run failed ({done.returncode}): {done.stderr[-400:]}")
            continue
        run = args.out / name
        spec = spec_from_run(run)
        m, p = measured(run), predicted(spec)
        rows.append({"name": name, "mu": spec.mu, "measured": m, "predicted": p})
        print(f"{name}: done", flush=True)
    keys = ("seconds_per_step", "step_age_p50", "step_age_p90", "step_age_mean")
    print("| run | mu | " + " | ".join(f"{k} (pred / meas, gap)" for k in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for r in rows:
        cells = []
        for k in keys:
            pv, mv = r["predicted"][k], r["measured"][k]
            gap = f"{(pv - mv) / mv:+.0%}" if mv else "n/a"
            cells.append(f"{pv:.3f} / {mv:.3f} ({gap})")
        print(f"| {r['name']} | {r['mu']:.2f} | " + " | ".join(cells) + " |")
    (args.out / "validation.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
