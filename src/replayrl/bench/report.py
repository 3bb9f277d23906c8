"""Plots and tables from run folders: accuracy against rollouts, compute and wall time.

Runs are grouped into variants (by folder name without its `-s<seed>` suffix, or explicitly);
each plot shows the median over seeds as a line and the inter-quartile range as a band,
interpolated on a common x grid (step-wise: the last eval at or before x).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from replayrl.run.metrics import read_metrics

AXES = {
    "rollouts_generated": "generated rollouts",
    "flops": "estimated compute (FLOPs: 2N per generated + 6N per trained token)",
    "wall_seconds": "wall time (s, excluding evaluation)",
}


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run folder's summary.json and metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = (
        read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    )
    return {"dir": run_dir, "summary": summary, "metrics": metrics}


def variant_of(run_dir: Path) -> str:
    return re.sub(r"-s\d+$", "", run_dir.name)


def group_runs(run_dirs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in run_dirs:
        if (d / "summary.json").exists():
            groups[variant_of(d)].append(load_run(d))
    return dict(groups)


def step_curve(xs: list[float], ys: list[float], grid: np.ndarray) -> np.ndarray:
    """y at each grid point = the last observation at or before it (NaN before the first)."""
    out = np.full(grid.shape, np.nan)
    order = np.argsort(xs)
    xs_a, ys_a = np.asarray(xs)[order], np.asarray(ys)[order]
    idx = np.searchsorted(xs_a, grid, side="right") - 1
    ok = idx >= 0
    out[ok] = ys_a[idx[ok]]
    return out


def median_band(
    runs: list[dict[str, Any]], x_key: str, y_key: str = "eval/accuracy", points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(grid, q25, median, q75) of y against x over a variant's seeds."""
    series = []
    for r in runs:
        evals = [e for e in r["summary"].get("evals", []) if e.get(x_key) is not None]
        if evals:
            series.append(([e[x_key] for e in evals], [e[y_key] for e in evals]))
    if not series:
        return None
    x_max = min(max(xs) for xs, _ in series)  # only where every seed has data
    grid = np.linspace(0, x_max, points)
    curves = np.stack([step_curve(xs, ys, grid) for xs, ys in series])
    q25, med, q75 = np.nanpercentile(curves, [25, 50, 75], axis=0)
    return grid, q25, med, q75


def plot_accuracy(
    groups: dict[str, list[dict[str, Any]]], out_dir: Path, target: float | None
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x_key, label in AXES.items():
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, runs in groups.items():
            band = median_band(runs, x_key)
            if band is None:
                continue
            grid, q25, med, q75 = band
            (line,) = ax.plot(grid, med, label=f"{name} (n={len(runs)})")
            ax.fill_between(grid, q25, q75, alpha=0.2, color=line.get_color())
        if target is not None:
            ax.axhline(
                target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.3f}"
            )
        ax.set_xlabel(label)
        ax.set_ylabel("eval accuracy (greedy pass@1)")
        ax.set_title(f"Eval accuracy against {label.split(' (')[0]}: median and IQR over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        path = out_dir / f"accuracy_vs_{x_key}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_training_curves(groups: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label in (
        ("train/entropy", "policy entropy (nats/token)"),
        ("completion_length", "mean completion length (tokens)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, runs in groups.items():
            per_run = []
            for r in runs:
                pts = [(m["step"], m[key]) for m in r["metrics"] if m.get(key) is not None]
                if pts:
                    per_run.append(pts)
            if not per_run:
                continue
            steps = min(max(s for s, _ in pts) for pts in per_run)
            grid = np.arange(1, steps + 1, dtype=float)
            curves = np.stack(
                [step_curve([s for s, _ in p], [v for _, v in p], grid) for p in per_run]
            )
            q25, med, q75 = np.nanpercentile(curves, [25, 50, 75], axis=0)
            (line,) = ax.plot(grid, med, label=name)
            ax.fill_between(grid, q25, q75, alpha=0.2, color=line.get_color())
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0].capitalize()} per step: median and IQR over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{key.replace('/', '_')}_vs_step.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def make_report(run_dirs: list[Path], out_dir: Path, target: float | None = None) -> list[Path]:
    """All plots for these runs into `out_dir`; returns the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group_runs(run_dirs)
    if not groups:
        raise ValueError("no run folder with a summary.json among the given paths")
    return plot_accuracy(groups, out_dir, target) + plot_training_curves(groups, out_dir)
