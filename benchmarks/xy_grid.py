"""The theory tested on the (x, y) grid: measured cost per cell against
paper 1's J(x, y) (arXiv 2604.08706) at alpha and rho fitted to the same cells.

    PYTHONPATH=src python benchmarks/xy_grid.py runs/bench/xy-grid [--mu 5.3] [--r 64]

Reads the `xy-grid` suite's summary.json (`replayrl bench xy-grid`, variants named
x<X>-y<Y>): per cell the median generated rollouts and modelled compute (mu = 5.3) to 90% of
grpo's gain. Fits alpha and rho (design.fit_alpha_rho: log compute = log c + log J), prints
the measured best cell beside the theory's unconstrained (x*, y*) and the feasible design at
the fitted values, and writes xy_heatmap.png (rollouts to 90% of the gain per cell; the
theory's feasible optimum marked) and xy_grid.md beside the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from replayrl.design.theory import (
    closed_form_power_law,
    feasible_design,
    fit_alpha_rho,
    objective,
    power_law_variance,
)

CELL = re.compile(r"^x(?P<x>[0-9.]+)-y(?P<y>[0-9.]+)$")


def cells(summary: dict) -> list[dict]:
    """(x, y, rollouts, compute) per grid variant; None costs (never reached) become inf."""
    out = []
    for name, row in summary["variants"].items():
        m = CELL.match(name)
        if not m:
            continue
        g = row["to_gain"]["0.9"]
        rollouts, compute = g["rollouts"]["median"], g["compute_paper_mu"]["median"]
        out.append(
            {
                "name": name,
                "x": float(m["x"]),
                "y": float(m["y"]),
                "rollouts": math.inf if rollouts is None else float(rollouts),
                "compute": math.inf if compute is None else float(compute),
                "non_inferior": row["non_inferior"],
            }
        )
    return out


def report(summary: dict, mu: float, r: int) -> tuple[str, dict]:
    cs = cells(summary)
    alpha, rho, rms = fit_alpha_rho(
        [c["x"] for c in cs], [c["y"] for c in cs], [c["compute"] for c in cs], mu
    )
    s2 = power_law_variance(alpha)
    xu, yu = closed_form_power_law(mu, alpha, rho) if (alpha or rho) else (math.inf, math.inf)
    fd = feasible_design(mu, alpha, rho, r, min_saving=0.0)
    best = min(cs, key=lambda c: c["compute"])
    lines = [
        f"Fitted on {sum(math.isfinite(c['compute']) for c in cs)} of {len(cs)} cells: alpha = "
        f"{alpha:.2f}, rho = {rho:.2f} (rms log residual {rms:.3f}); mu = {mu}",
        f"Theory: unconstrained x* = {xu:.3g}, y* = {yu:.3g}; feasible (N >= R) x = {fd.x:.3g}, "
        f"y = {fd.y:.3g} ({fd.reason})",
        f"Measured best cell (modelled compute to 90% of grpo's gain): {best['name']}",
        "",
        "| cell | rollouts to 90% gain | compute mu=5.3 to 90% gain | J(x, y) (fitted) | "
        "final non-inferior |",
        "|---|---|---|---|---|",
    ]
    for c in sorted(cs, key=lambda c: (c["y"], c["x"])):
        j = float(objective(c["x"], c["y"], mu, rho, s2))
        lines.append(
            f"| {c['name']} | {c['rollouts']:.0f} | {c['compute']:.0f} | {j:.3g} | "
            f"{'yes' if c['non_inferior'] else 'no'} |"
        )
    lines += ["", *leave_one_out(cs, mu, r, best["name"])]
    return "\n".join(lines) + "\n", {"alpha": alpha, "rho": rho, "feasible": (fd.x, fd.y)}


def leave_one_out(cs: list[dict], mu: float, r: int, best: str) -> list[str]:
    """The fit is in-sample; refit without each cell in turn (the best one included) and say
    where the theory's feasible optimum lands: an out-of-sample check of its prediction."""
    lines = [
        "Leave-one-out: alpha, rho refitted without one cell, and the feasible optimum then",
        "",
        "| left out | alpha | rho | x | y |",
        "|---|---|---|---|---|",
    ]
    for c in cs:
        rest = [o for o in cs if o is not c]
        a, rh, _ = fit_alpha_rho(
            [o["x"] for o in rest], [o["y"] for o in rest], [o["compute"] for o in rest], mu
        )
        fd = feasible_design(mu, a, rh, r, min_saving=0.0)
        mark = " (the measured best)" if c["name"] == best else ""
        lines.append(f"| {c['name']}{mark} | {a:.2f} | {rh:.2f} | {fd.x:.3g} | {fd.y:.3g} |")
    return lines


def heatmap(cs: list[dict], theory: tuple[float, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    xs, ys = sorted({c["x"] for c in cs}), sorted({c["y"] for c in cs})
    grid = np.full((len(ys), len(xs)), np.nan)
    for c in cs:
        v = c["rollouts"]
        grid[ys.index(c["y"]), xs.index(c["x"])] = v if math.isfinite(v) else np.nan
    fig, ax = plt.subplots(figsize=(5, 3.5))
    im = ax.imshow(grid, origin="lower", cmap="viridis_r")
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
    ax.set_xlabel("x = N/R (staleness horizon)")
    ax.set_ylabel("y = B/R (replay ratio)")
    for i in range(len(ys)):
        for j in range(len(xs)):
            txt = "never" if np.isnan(grid[i, j]) else f"{grid[i, j]:.0f}"
            ax.text(j, i, txt, ha="center", va="center", color="w", fontsize=8)
    # the theory's feasible optimum, placed on the log2 axes of the grid
    tx = np.interp(math.log2(theory[0]), [math.log2(x) for x in xs], range(len(xs)))
    ty = np.interp(math.log2(theory[1]), [math.log2(y) for y in ys], range(len(ys)))
    ax.plot(tx, ty, "r*", markersize=14, label="theory (fitted, feasible)")
    ax.legend(loc="upper right", fontsize=7)
    fig.colorbar(im, ax=ax, label="rollouts to 90% of grpo's gain")
    ax.set_title("equal modelled compute (mu = 5.3)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the xy-grid suite's folder (its summary.json)")
    p.add_argument("--mu", type=float, default=5.3)
    p.add_argument("--r", type=int, default=64, help="R of the grid's cells")
    args = p.parse_args(argv)
    summary = json.loads((args.folder / "summary.json").read_text())
    try:
        text, fit = report(summary, args.mu, args.r)
    except ValueError as exc:  # e.g. too few cells reached 90% of the gain to fit
        print(f"xy_grid: {exc}", file=sys.stderr)
        return 2
    (args.folder / "xy_grid.md").write_text(text)
    heatmap(cells(summary), fit["feasible"], args.folder / "xy_heatmap.png")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
