"""Plots from run folders: accuracy against rollouts, compute and wall time; reward,
completion length and entropy against steps and rollouts.

Runs are grouped into variants (by folder name without its `-s<seed>` suffix, or explicitly);
each plot shows the median over seeds as a line and the inter-quartile range as a band,
interpolated on a common x grid (step-wise: the last eval at or before x).

What each plot says on its face: the title names the task, the model and the seeds; a method
has one colour in every plot (`method_color`, keyed by its name); the headline target (90% of
the baseline's gain: start + 0.9 (final - start), bench/targets.py) is drawn and labelled;
a panel holds at most `MAX_LINES` lines (the baseline and the best methods by median final
accuracy), and with more methods `*_all.png` shows every one as small multiples beside the
baseline.
"""

from __future__ import annotations

import json
import math
import re
import warnings
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from replayrl.bench.targets import HEADLINE, gain_targets
from replayrl.run.metrics import read_metrics

AXES = {
    "rollouts_generated": "generated rollouts",
    "flops": "estimated compute (FLOPs: 2N per generated + 6N per trained token)",
    "wall_seconds": "wall time (s, excluding evaluation)",
}


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run folder's summary.json, metrics.jsonl and config.yaml (for plot titles)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = (
        read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    )
    config: dict[str, Any] = {}
    if (run_dir / "config.yaml").is_file():
        loaded = yaml.safe_load((run_dir / "config.yaml").read_text())
        config = loaded if isinstance(loaded, dict) else {}
    return {"dir": run_dir, "summary": summary, "metrics": metrics, "config": config}


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


MAX_LINES = 5  # lines per panel: the baseline and the best methods
# one colour per method in every plot: the shipped methods' fixed, any other name's drawn
# from its name (the same name, the same colour, whatever else is plotted beside it)
METHOD_COLORS = {
    "grpo": "#000000",
    "ppo": "#555555",
    "replay": "#1f77b4",
    "replay-posbias": "#2ca02c",
    "replay-auto": "#17becf",
    "remix-grpo": "#d62728",
    "remix-ppo": "#ff7f0e",
    "dapo": "#9467bd",
    "group-replay": "#8c564b",
    "ar3po": "#e377c2",
    "exgrpo": "#bcbd22",
}
_PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
]  # fmt: skip


def method_color(name: str) -> str:
    """The colour of a method (variant) in every plot."""
    if name in METHOD_COLORS:
        return METHOD_COLORS[name]
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


def describe_runs(groups: dict[str, list[dict[str, Any]]]) -> str:
    """'task ..., model ..., seeds ...' from the runs' config.yaml (what a title names)."""
    tasks, models, seeds = set(), set(), set()
    for runs in groups.values():
        for r in runs:
            cfg = r.get("config") or {}
            tasks.add(_task_label(cfg.get("task") or {}))
            models.add(_model_label(cfg.get("model") or {}))
            seed = (cfg.get("train") or {}).get("seed")
            if seed is not None:
                seeds.add(int(seed))
    seed_text = ", ".join(str(s) for s in sorted(seeds)) or "?"
    return (
        f"task {' / '.join(sorted(tasks)) or '?'}; model {' / '.join(sorted(models)) or '?'}; "
        f"seeds {seed_text}"
    )


def _task_label(t: dict[str, Any]) -> str:
    """A recorded run's task: its name and its settings in a few words (its registry entry's
    description); the name alone for a task this install does not have, or settings it no
    longer reads."""
    from replayrl.config.schema import TaskConfig
    from replayrl.rollout.tasks import describe_task

    name = str(t.get("name", "?"))
    try:
        with warnings.catch_warnings():  # a record in the old flat layout: read, not reported
            warnings.simplefilter("ignore", FutureWarning)
            label = describe_task(TaskConfig.model_validate(t))
    except ValueError:
        return name
    return f"{name}: {label}" if label != name else name


def _model_label(m: dict[str, Any]) -> str:
    path = m.get("path")
    return Path(str(path)).name if path else "built-in tiny Llama"


def _final(runs: list[dict[str, Any]]) -> float:
    vals = [r["summary"].get("final_eval_accuracy") for r in runs]
    finite = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.median(finite)) if finite else -math.inf


def shown_methods(groups: dict[str, list[dict[str, Any]]], baseline: str | None) -> list[str]:
    """At most MAX_LINES methods: the baseline first, then the best by median final accuracy."""
    others = sorted((n for n in groups if n != baseline), key=lambda n: -_final(groups[n]))
    head = [baseline] if baseline in groups else []
    return head + others[: MAX_LINES - len(head)]


def headline_target(
    groups: dict[str, list[dict[str, Any]]], baseline: str | None
) -> tuple[float, str] | None:
    """(accuracy, label) of the headline target: 90% of the baseline's median gain."""
    if baseline not in groups:
        return None
    g = gain_targets([r["summary"] for r in groups[baseline]])
    value = g["targets"][HEADLINE]
    if not math.isfinite(value):
        return None
    return value, (
        f"target {value:.3f} = {HEADLINE:.0%} of {baseline}'s gain "
        f"({g['start']:.3f} -> {g['final']:.3f})"
    )


def _draw_band(ax: Any, grid: np.ndarray, band: tuple[np.ndarray, ...], name: str, n: int) -> None:
    q25, med, q75 = band
    color = method_color(name)
    ax.plot(grid, med, color=color, label=f"{name} (n={n})", linewidth=1.6)
    ax.fill_between(grid, q25, q75, alpha=0.15, color=color)


def _draw_target(ax: Any, target: tuple[float, str] | None) -> None:
    if target is not None:
        ax.axhline(target[0], color="grey", linestyle="--", linewidth=1, label=target[1])


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(
    groups: dict[str, list[dict[str, Any]]],
    out_dir: Path,
    target: tuple[float, str] | None,
    baseline: str | None = None,
) -> list[Path]:
    """Accuracy against each x of AXES: baseline + best methods (and every method as small
    multiples when there are more than MAX_LINES)."""
    plt = _pyplot()
    about = describe_runs(groups)
    shown = shown_methods(groups, baseline)
    paths = []
    for x_key, label in AXES.items():
        fig, ax = plt.subplots(figsize=(8, 5))
        for name in shown:
            band = median_band(groups[name], x_key)
            if band is not None:
                _draw_band(ax, band[0], band[1:], name, len(groups[name]))
        _draw_target(ax, target)
        ax.set_xlabel(label)
        ax.set_ylabel("eval accuracy (greedy pass@1)")
        left_out = len(groups) - len(shown)
        more = f"; {left_out} more in {f'accuracy_vs_{x_key}_all.png'}" if left_out else ""
        ax.set_title(f"Eval accuracy, median and IQR over seeds{more}\n{about}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        paths.append(_save(fig, out_dir / f"accuracy_vs_{x_key}.png"))
        if left_out:
            paths.append(_small_multiples(groups, out_dir, x_key, label, target, baseline))
    return paths


def _small_multiples(
    groups: dict[str, list[dict[str, Any]]],
    out_dir: Path,
    x_key: str,
    label: str,
    target: tuple[float, str] | None,
    baseline: str | None,
) -> Path:
    """One panel per method, each beside the baseline (grey): every method, few lines each."""
    plt = _pyplot()
    names = [n for n in groups if n != baseline]
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4 * cols, 3 * rows), sharex=True, sharey=True, squeeze=False
    )
    for ax, name in zip(axes.flat, names, strict=False):
        pair = [baseline, name] if baseline is not None and baseline in groups else [name]
        for who in pair:
            band = median_band(groups[who], x_key)
            if band is not None:
                _draw_band(ax, band[0], band[1:], who, len(groups[who]))
        _draw_target(ax, target)
        ax.set_title(name, fontsize=9, color=method_color(name))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"Eval accuracy against {label}\n{describe_runs(groups)}", fontsize=9)
    return _save(fig, out_dir / f"accuracy_vs_{x_key}_all.png")


# per-step metrics (metrics.jsonl) against steps and generated rollouts
CURVES = (
    ("reward/mean", "mean reward of fresh rollouts"),
    ("completion_length", "mean completion length (tokens)"),
    ("train/entropy", "policy entropy (nats/token)"),
)
CURVE_AXES = (("step", "training step"), ("rollouts_generated", "generated rollouts"))


def metric_band(
    runs: list[dict[str, Any]], key: str, x_key: str, points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(grid, q25, median, q75) of a per-step metric against `x_key` over a variant's seeds."""
    per_run = []
    for r in runs:
        pts = [
            (float(m[x_key]), float(m[key]))
            for m in r["metrics"]
            if m.get(key) is not None and m.get(x_key) is not None
        ]
        if pts:
            per_run.append(pts)
    if not per_run:
        return None
    x_max = min(max(x for x, _ in p) for p in per_run)
    x_min = max(min(x for x, _ in p) for p in per_run)
    grid = (
        np.arange(x_min, x_max + 1, dtype=float)
        if x_key == "step"
        else np.linspace(x_min, x_max, points)
    )
    curves = np.stack([step_curve([x for x, _ in p], [v for _, v in p], grid) for p in per_run])
    q25, med, q75 = np.nanpercentile(curves, [25, 50, 75], axis=0)
    return grid, q25, med, q75


def plot_training_curves(
    groups: dict[str, list[dict[str, Any]]], out_dir: Path, baseline: str | None = None
) -> list[Path]:
    """Reward, completion length and entropy against steps and generated rollouts."""
    plt = _pyplot()
    about = describe_runs(groups)
    shown = shown_methods(groups, baseline)
    paths = []
    for key, label in CURVES:
        for x_key, x_label in CURVE_AXES:
            fig, ax = plt.subplots(figsize=(8, 4.5))
            drawn = 0
            for name in shown:
                band = metric_band(groups[name], key, x_key)
                if band is not None:
                    _draw_band(ax, band[0], band[1:], name, len(groups[name]))
                    drawn += 1
            if not drawn:
                plt.close(fig)
                continue
            ax.set_xlabel(x_label)
            ax.set_ylabel(label)
            what = label.split(" (")[0]
            ax.set_title(
                f"{what[0].upper()}{what[1:]}: median and IQR over seeds\n{about}", fontsize=9
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            paths.append(_save(fig, out_dir / f"{key.replace('/', '_')}_vs_{x_key}.png"))
    return paths


def make_report(
    run_dirs: list[Path],
    out_dir: Path,
    target: float | None = None,
    baseline: str | None = None,
) -> list[Path]:
    """All plots for these runs into `out_dir`; returns the written paths.

    `baseline`: the variant the headline target (90% of its gain) is drawn from, shown in
    every panel; `target`: an accuracy to draw instead (labelled as given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group_runs(run_dirs)
    if not groups:
        raise ValueError("no run folder with a summary.json among the given paths")
    if baseline is not None and baseline not in groups:
        raise ValueError(
            f"baseline {baseline!r} is not among the runs' variants ({', '.join(groups)})"
        )
    line = headline_target(groups, baseline)
    if target is not None:
        line = (target, f"target {target:.3f}")
    return plot_accuracy(groups, out_dir, line, baseline) + plot_training_curves(
        groups, out_dir, baseline
    )
