"""The papers' findings measured on the reasoning suite's runs.

    PYTHONPATH=src python benchmarks/findings.py RUNS_ROOT OUT [--buffers BUF_ROOT] [--passk]

RUNS_ROOT holds the suite's runs (`<task>/<variant>-s<seed>/`, from `replayrl bench
reasoning`); only finished runs (with a summary.json) are read. OUT gets PNG figures and
`findings.md`:

- whipping effect / policy reincarnation (arXiv 2507.06892): sampled completion length per
  step, GRPO against the off-policy variants, ReMix's reincarnation step T marked;
- entropy with and without replay (arXiv 2604.08706): `train/entropy` per step;
- pass@1 and pass@k (arXiv 2604.08706): greedy pass@1 and pass@8 at temperature 1 on the
  held-out split, for the warm start and each run's final checkpoint. `--passk` evaluates
  what `OUT/passk.json` does not hold yet (one torch thread, sampling seeded), then reports;
  without it the report uses the cached results only;
- buffer capacity (arXiv 2604.08706): the `replay` runs of BUF_ROOT
  (`benchmarks/buffer_sizes.py`) beside the suite's own replay run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from replayrl.bench.paper_findings import (
    Curve,
    at_x,
    finished_runs,
    gain,
    median_curve,
    moving_average,
    rollouts_to_target,
    series,
    volatility,
    window_mean,
)
from replayrl.run.metrics import read_metrics
from replayrl.storage.io import atomic_write_json, atomic_write_text

TASKS = ["add", "sub", "chain"]
# grpo-utd4 (GRPO at ReMix's updates per batch) is on-policy data, listed here as ReMix's control
OFF_POLICY = ["replay", "replay-posbias", "remix-grpo", "grpo-utd4"]
WITH_REPLAY = ["replay", "replay-posbias", "replay-auto"]
PASS_K = 8
BUFFER_SIZES = "PYTHONPATH=src python benchmarks/buffer_sizes.py runs/buffers"
# staleness, per step (mean over steps, median over seeds): effective sample size / N of the
# importance weights on stale and fresh tokens, the batch's policy lag, the KL-Convex terms
STALENESS = {
    "ESS/N stale": "train/off_policy/ess",
    "ESS/N fresh": "train/on_policy/ess",
    "lag mean": "batch/age_mean",
    "lag max": "batch/age_max",
    "KL term base": "train/kl_term_base",
    "KL term prev": "train/kl_term_prev",
}
SMOOTH = 5  # steps in the moving average of the per-step figures (the tables use raw values)
COLORS = {
    "grpo": "black",
    "replay": "tab:blue",
    "replay-posbias": "tab:orange",
    "replay-auto": "tab:purple",
    "remix-grpo": "tab:green",
}

Runs = dict[str, dict[str, dict[int, dict[str, Any]]]]  # task -> variant -> seed -> run


def load_runs(root: Path, tasks: list[str]) -> Runs:
    out: Runs = {}
    for task in tasks:
        if not (root / task).is_dir():
            continue
        for variant, seeds in finished_runs(root / task).items():
            for seed, d in seeds.items():
                out.setdefault(task, {}).setdefault(variant, {})[seed] = {
                    "dir": d,
                    "rows": read_metrics(d / "metrics.jsonl"),
                    "summary": json.loads((d / "summary.json").read_text()),
                }
    return out


def seeds_line(runs: Runs) -> str:
    parts = []
    for task, variants in runs.items():
        cells = [f"{v} {sorted(s)}" for v, s in sorted(variants.items())]
        parts.append(f"- {task}: " + ", ".join(cells))
    return "\n".join(parts)


def fmt(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def med(vals: list[float | None]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def spread(vals: list[float | None], digits: int) -> str:
    """`min-max` over seeds, or `one seed`."""
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        return "one seed"
    return f"{min(vals):.{digits}f}-{max(vals):.{digits}f}"


def curve(run: dict[str, Any], key: str, x: str = "step") -> Curve:
    return series(run["rows"], key, x)


def eval_curve(run: dict[str, Any]) -> Curve:
    """Eval accuracy against rollouts generated (eval rows carry only the step)."""
    return at_x(curve(run, "eval/accuracy"), curve(run, "rollouts_generated"))


def reincarnation_step(runs: Runs) -> int | None:
    for variants in runs.values():
        for run in variants.get("remix-grpo", {}).values():
            t = run["summary"].get("reincarnation_step")
            if t is not None:
                return int(t)
    return None


# ---- figures ----------------------------------------------------------------------------


def plot_per_step(runs: Runs, key: str, variants: list[str], ylabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(runs)
    t_reinc = reincarnation_step(runs)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for v in variants:
            seeds = runs[task].get(v, {})
            if not seeds:
                continue
            xs, ys = median_curve([curve(r, key) for r in seeds.values()])
            ax.plot(
                xs,
                moving_average(ys, SMOOTH),
                label=f"{v} (seeds {sorted(seeds)})",
                color=COLORS.get(v),
            )
        if t_reinc is not None and "remix-grpo" in variants:
            ax.axvline(t_reinc, color="tab:green", ls="--", lw=1, label=f"ReMix T={t_reinc}")
        ax.set_title(task)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{ylabel}: median over seeds, {SMOOTH}-step moving average")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_buffers(
    buf: list[tuple[int, str, int, dict[str, Any]]], target: float | None, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors: dict[str, str] = {}
    for _, label, seed, run in buf:
        xs, ys = eval_curve(run)
        color = colors.setdefault(label, f"C{len(colors)}")
        ls = ["-", "--", ":"][seed % 3]
        ax.plot(xs, ys, marker=".", lw=1, ls=ls, color=color, label=f"N = {label}, s{seed}")
    if target is not None:
        ax.axhline(target, color="gray", ls=":", label=f"GRPO final {target:.3f}")
    ax.set_xlabel("generated rollouts")
    ax.set_ylabel("eval accuracy (greedy, 200 prompts)")
    ax.set_title("add, replay (B = 128, R = 64): buffer capacity N")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_passk(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows}, key=TASKS.index)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        trs = [r for r in rows if r["task"] == task]
        names = [r["variant"] for r in trs]
        xs = range(len(trs))
        ax.bar([x - 0.2 for x in xs], [r["pass@1"] for r in trs], 0.4, label="pass@1 (greedy)")
        ax.bar([x + 0.2 for x in xs], [r[f"pass@{PASS_K}"] for r in trs], 0.4, label="pass@8 (T=1)")
        ax.set_xticks(list(xs), names, rotation=40, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(task)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle("Held-out pass@1 and pass@8: warm start and final policies (median over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- pass@k evaluation ------------------------------------------------------------------


def evaluate_model(config_yaml: Path, model_dir: str, seed: int = 0) -> dict[str, float]:
    """Greedy pass@1 and pass@8 at temperature 1 on the held-out split, as `replayrl eval`
    computes them (same loading and `evaluate`), with one torch thread and a seeded sampler."""
    import torch

    from replayrl.config.schema import load_config
    from replayrl.models.loading import unwrap_model
    from replayrl.rollout.evaluation import evaluate
    from replayrl.rollout.generation import HFGenerator
    from replayrl.rollout.prompts import PromptRenderer
    from replayrl.rollout.tasks import task_from_config
    from replayrl.run.policy import load_policy

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg = load_config(config_yaml)
    cfg.model.path = model_dir
    cfg.model.lora.enabled = False
    model, tok, _ = load_policy(cfg.model, cfg.task, log=lambda m: None)
    task = task_from_config(cfg.task)
    rows = task.eval_rows()[: cfg.eval.num_prompts] if cfg.eval.num_prompts else task.eval_rows()
    gen = HFGenerator(
        unwrap_model(model), tok, cfg.eval.batch_size, impl=cfg.rollout.generation_impl
    )
    render = PromptRenderer(tok, cfg.task.chat_template, cfg.task.system_prompt)
    res = evaluate(gen, task, rows, cfg.rollout.max_new_tokens, PASS_K, 1.0, render=render)
    return {
        "pass@1": res["eval/accuracy"],
        f"pass@{PASS_K}": res[f"eval/pass@{PASS_K}"],
        "greedy_length": res["eval/completion_length"],
        "num_prompts": len(rows),
    }


def final_policy(run: dict[str, Any]) -> Path | None:
    steps = run["summary"].get("steps")
    p = run["dir"] / "checkpoints" / f"step_{int(steps):06d}" / "policy"
    return p if steps is not None and (p / "config.json").is_file() else None


def passk_jobs(runs: Runs) -> list[tuple[str, Path, str, str]]:
    """(cache key, config.yaml, model folder, model id) for each task's warm start and final
    policies. The id, kept in the cache to notice a rerun, names the checkpoint without this
    machine's paths: `<run>/<step>@<wall seconds>` or `warmstart/<config hash>`."""
    jobs = []
    for task, variants in runs.items():
        first, warm = len(jobs), None
        for v in sorted(variants):
            for seed, run in sorted(variants[v].items()):
                if warm is None and run["summary"].get("model_path"):
                    warm = (run["dir"] / "config.yaml", Path(run["summary"]["model_path"]))
                pol = final_policy(run)
                if pol is not None:
                    wall = round(float(run["summary"].get("wall_seconds", 0.0)), 1)
                    ident = f"{run['dir'].name}/{pol.parent.name}@{wall}"
                    cfg = run["dir"] / "config.yaml"
                    jobs.append((f"{task}/{v}-s{seed}", cfg, str(pol), ident))
        if warm is not None:
            ident = f"warmstart/{warm[1].name}"
            jobs.insert(first, (f"{task}/warm-start", warm[0], str(warm[1]), ident))
    return jobs


def run_passk(runs: Runs, cache_path: Path) -> dict[str, Any]:
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    for key, cfg, model, ident in passk_jobs(runs):
        if key in cache and cache[key].get("model") == ident:
            continue
        print("pass@k:", key, flush=True)
        cache[key] = {"model": ident, **evaluate_model(cfg, model)}
        atomic_write_json(cache_path, cache)  # after each model: a stopped run keeps its work
    return cache


def passk_table(runs: Runs, cache: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for task, variants in runs.items():
        w = cache.get(f"{task}/warm-start")
        if w is None:
            continue
        out.append({"task": task, "variant": "warm start", "seeds": [], **w})
        for v in ["grpo", *OFF_POLICY, "replay-auto", "ppo", "remix-ppo"]:
            hits = {s: cache.get(f"{task}/{v}-s{s}") for s in variants.get(v, {})}
            hits = {s: h for s, h in hits.items() if h is not None}
            if not hits:
                continue
            row: dict[str, Any] = {"task": task, "variant": v, "seeds": sorted(hits)}
            for k in ("pass@1", f"pass@{PASS_K}", "greedy_length"):
                row[k] = statistics.median(h[k] for h in hits.values())
            out.append(row)
    return out


# ---- report sections --------------------------------------------------------------------


def staleness_cells(seeds: dict[int, dict[str, Any]]) -> list[str]:
    """The staleness columns: per metric, the median over seeds of its mean over steps."""
    out = []
    for name, key in STALENESS.items():
        v = med([window_mean(curve(r, key), 0, float("inf")) for r in seeds.values()])
        out.append(
            fmt(v, 2 if name.startswith("lag") else 3)
            if not name.startswith("KL")
            else ("n/a" if v is None else f"{v:.2g}")
        )
    return out


def whipping_section(runs: Runs, out: Path) -> list[str]:
    plot_per_step(
        runs, "completion_length", ["grpo", *OFF_POLICY], "sampled completion length", out
    )
    t = reincarnation_step(runs)
    lines = [
        "## Whipping effect and policy reincarnation (arXiv 2507.06892)",
        "",
        f"![length]({out.name})",
        "",
        "Sampled completion length (tokens, mean over the step's fresh rollouts; training "
        "rollouts at temperature 1), median over seeds. Columns: mean over steps 1-80 (the "
        "steps every variant has, whatever it generates a step) and over "
        "generated rollouts 2,561-7,680 (the same data budget for all); the difference to GRPO "
        "in brackets; then the range over seeds of the second, and how stale the updates "
        "are, each the mean over steps: the effective sample size over N of the importance "
        "weights pi_theta / pi_behaviour on stale and on fresh tokens (1 = all weights equal; "
        "`train/off_policy/ess`, `train/on_policy/ess`), the policy-version lag of the batch "
        "(`batch/age_mean`, `batch/age_max`) and the KL-Convex terms' size in the loss "
        "(coefficient x KL: `train/kl_term_base`, `train/kl_term_prev`); n/a: not logged (no "
        "stale tokens, no KL term, or a run from before these metrics).",
        "",
        "| task | variant | seeds | length, steps 1-80 | length, rollouts 2,561-7,680 | "
        f"range over seeds | {' | '.join(STALENESS)} |",
        "|---|---|---|---|---|---|" + "---|" * len(STALENESS),
    ]
    shorter = total = 0
    for task, variants in runs.items():
        base = {}
        for v in ["grpo", *OFF_POLICY]:
            seeds = variants.get(v, {})
            if not seeds:
                continue
            a = med([window_mean(curve(r, "completion_length"), 0, 80) for r in seeds.values()])
            per_seed = [
                window_mean(curve(r, "completion_length", "rollouts_generated"), 2560, 7680)
                for r in seeds.values()
            ]
            b = med(per_seed)
            if v == "grpo":
                base = {"a": a, "b": b}
                cells = [fmt(a, 1), fmt(b, 1)]
            else:
                da, db = gain(base.get("a"), a), gain(base.get("b"), b)
                cells = [f"{fmt(a, 1)} ({da:+.1f})" if da is not None else fmt(a, 1)]
                cells.append(f"{fmt(b, 1)} ({db:+.1f})" if db is not None else fmt(b, 1))
                if db is not None:
                    total += 1
                    shorter += db < 0
            stale = " | ".join(staleness_cells(seeds))
            lines.append(
                f"| {task} | {v} | {sorted(seeds)} | {cells[0]} | {cells[1]} | "
                f"{spread(per_seed, 1)} | {stale} |"
            )
    lines += [
        "",
        f"Off-policy variants shorter than GRPO at equal data: {shorter} of {total} "
        "(task, variant) pairs.",
        "",
    ]
    if t is None:
        return [*lines, "No finished ReMix run: reincarnation not measured.", ""]
    lines += [
        f"Reincarnation at step T = {t}: mean sampled length over steps (T-10, T] (before), "
        "(T, T+10] (just after) and (T+10, T+30] (later); GRPO over the same steps as the "
        "control for the trend every run has at that point.",
        "",
        "| task | variant | seeds | before | just after | later | later - before |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, variants in runs.items():
        for v in ["remix-grpo", "grpo"]:
            seeds = variants.get(v, {})
            if not seeds:
                continue
            c = [curve(r, "completion_length") for r in seeds.values()]
            before = med([window_mean(x, t - 10, t) for x in c])
            after = med([window_mean(x, t, t + 10) for x in c])
            later = med([window_mean(x, t + 10, t + 30) for x in c])
            d = gain(before, later)
            lines.append(
                f"| {task} | {v} | {sorted(seeds)} | {fmt(before, 1)} | {fmt(after, 1)} | "
                f"{fmt(later, 1)} | {'n/a' if d is None else f'{d:+.1f}'} |"
            )
    return [*lines, ""]


def entropy_section(runs: Runs, out: Path) -> list[str]:
    plot_per_step(runs, "train/entropy", ["grpo", *WITH_REPLAY], "train entropy (nats/token)", out)
    lines = [
        "## Entropy with and without replay (arXiv 2604.08706)",
        "",
        f"![entropy]({out.name})",
        "",
        "`train/entropy`: the current policy's mean token entropy on the step's training batch "
        "(for replay that batch mixes fresh and stored rollouts), median over seeds. Columns: "
        "mean over steps 41-80 and over generated rollouts 2,561-7,680; ratio to GRPO in "
        "brackets; the last column is the range over seeds of the second.",
        "",
        "| task | variant | seeds | entropy, steps 41-80 | entropy, rollouts 2,561-7,680 | "
        "range over seeds |",
        "|---|---|---|---|---|---|",
    ]
    higher = total = 0
    for task, variants in runs.items():
        base: dict[str, float | None] = {}
        for v in ["grpo", *WITH_REPLAY]:
            seeds = variants.get(v, {})
            if not seeds:
                continue
            a = med([window_mean(curve(r, "train/entropy"), 40, 80) for r in seeds.values()])
            per_seed = [
                window_mean(curve(r, "train/entropy", "rollouts_generated"), 2560, 7680)
                for r in seeds.values()
            ]
            b = med(per_seed)
            if v == "grpo":
                base = {"a": a, "b": b}
                cells = [fmt(a, 4), fmt(b, 4)]
            else:
                cells = []
                for val, ref in ((a, base.get("a")), (b, base.get("b"))):
                    ok = val is not None and ref
                    cells.append(f"{fmt(val, 4)} (x{val / ref:.2f})" if ok else fmt(val, 4))
                if b is not None and base.get("b"):
                    total += 1
                    higher += b > base["b"]
            lines.append(
                f"| {task} | {v} | {sorted(seeds)} | {cells[0]} | {cells[1]} | "
                f"{spread(per_seed, 4)} |"
            )
    lines += [
        "",
        f"Replay variants with higher entropy than GRPO at equal data: {higher} of {total} "
        "(task, variant) pairs.",
        "",
    ]
    return lines


def passk_section(runs: Runs, cache: dict[str, Any], out: Path) -> list[str]:
    rows = passk_table(runs, cache)
    lines = ["## pass@1 and pass@8 (arXiv 2604.08706)", ""]
    if not rows:
        return [*lines, "Not evaluated (run with `--passk`).", ""]
    plot_passk(rows, out)
    lines += [
        f"![passk]({out.name})",
        "",
        "Greedy pass@1 and pass@8 (8 samples at temperature 1, unbiased estimator) on the "
        "held-out split (200 prompts), warm start and each run's final checkpoint; median over "
        "seeds. Gains over the warm start, the difference to GRPO's final policy, and the mean "
        "greedy completion length (tokens).",
        "",
        "| task | policy | seeds | pass@1 | pass@8 | pass@1 gain | pass@8 gain | "
        "pass@1 - GRPO | pass@8 - GRPO | greedy length |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    k = f"pass@{PASS_K}"
    more = total = 0
    for task in dict.fromkeys(r["task"] for r in rows):
        trs = {r["variant"]: r for r in rows if r["task"] == task}
        w, g = trs["warm start"], trs.get("grpo")
        for v, r in trs.items():
            d1 = gain(g["pass@1"], r["pass@1"]) if g and v not in ("warm start", "grpo") else None
            dk = gain(g[k], r[k]) if g and v not in ("warm start", "grpo") else None
            lines.append(
                f"| {task} | {v} | {r['seeds']} | {fmt(r['pass@1'])} | {fmt(r[k])} | "
                f"{fmt(gain(w['pass@1'], r['pass@1']))} | {fmt(gain(w[k], r[k]))} | "
                f"{fmt(d1)} | {fmt(dk)} | {fmt(r['greedy_length'], 1)} |"
            )
            if d1 is not None and dk is not None:
                total += 1
                more += dk > d1
    return [
        *lines,
        "",
        f"Reuse variants whose pass@8 edge over GRPO is larger than their pass@1 edge: {more} "
        f"of {total} (task, variant) pairs.",
        "",
    ]


def buffer_section(runs: Runs, buf_root: Path | None, out: Path) -> list[str]:
    lines = ["## Buffer capacity: slower but steadier? (arXiv 2604.08706)", ""]
    # (N, label, seed, run): the suite's own replay runs (N = 256; seed 0 possibly older
    # code: see its config.yaml) and the runs of benchmarks/buffer_sizes.py (current code)
    buf: list[tuple[int, str, int, dict[str, Any]]] = []
    for seed, run in runs.get("add", {}).get("replay", {}).items():
        buf.append((256, "256 (suite run)", seed, run))
    if buf_root is not None and (buf_root / "add").is_dir():
        for v, seeds in finished_runs(buf_root / "add").items():
            if not v.startswith("replay-cap"):
                continue
            cap = int(v.removeprefix("replay-cap"))
            for seed, d in seeds.items():
                run = {
                    "dir": d,
                    "rows": read_metrics(d / "metrics.jsonl"),
                    "summary": json.loads((d / "summary.json").read_text()),
                }
                buf.append((cap, str(cap), seed, run))
    buf.sort(key=lambda e: (e[0], e[1], e[2]))
    if len({e[0] for e in buf}) < 2:
        return [*lines, "Fewer than two capacities finished: not measured.", ""]
    grpo = runs.get("add", {}).get("grpo", {})
    target = med([r["summary"].get("final_eval_accuracy") for r in grpo.values()])
    plot_buffers(buf, target, out)
    lines += [
        f"![buffers]({out.name})",
        "",
        "Task add, `replay` preset (R = 64 rollouts a step, B = 128, 120 steps), one row per "
        "run. '256 (suite run)' is the suite's own replay run; the others, from "
        "`benchmarks/buffer_sizes.py`, only change `buffer.capacity` (a plain 256 among them is "
        "the same config rerun with the current code, whose generation draws other random "
        "numbers: the 256 rows of one seed show how much that alone moves these numbers). Target: "
        f"GRPO's median final accuracy on add ({fmt(target)}, seeds {sorted(grpo)}) and 0.95. "
        "Volatility: mean |change| of eval accuracy between consecutive evaluations (every 256 "
        "rollouts), over the whole run and after 2,560 rollouts (where GRPO has plateaued).",
        "",
        "| N | seed | x = N/R | rollouts to GRPO final | rollouts to 0.95 | final | best | "
        "volatility, all | volatility, after 2,560 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cap, label, seed, run in buf:
        xs, ys = eval_curve(run)
        late = [y for x, y in zip(xs, ys, strict=True) if x > 2560]
        to_t = rollouts_to_target((xs, ys), target) if target is not None else None
        to_95 = rollouts_to_target((xs, ys), 0.95)
        lines.append(
            f"| {label} | {seed} | {cap / 64:g} | {fmt(to_t, 0)} | {fmt(to_95, 0)} | "
            f"{fmt(ys[-1])} | {fmt(max(ys))} | {fmt(volatility(ys))} | {fmt(volatility(late))} |"
        )
    return [*lines, ""]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs_root", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--buffers", type=Path, help="root of benchmarks/buffer_sizes.py's runs")
    ap.add_argument("--passk", action="store_true", help="evaluate missing pass@k entries")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument(
        "--runs-command",
        default="replayrl bench reasoning --seeds 0 1 2",
        help="the command that made the runs under runs_root (quoted in the report)",
    )
    args = ap.parse_args(argv)
    runs = load_runs(args.runs_root, args.tasks)
    if not runs:
        print(f"no finished runs under {args.runs_root}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    cache_path = args.out / "passk.json"
    if args.passk:
        cache = run_passk(runs, cache_path)
    else:
        cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    readings = args.out / "readings.md"
    md = [
        f"# The papers' findings on the runs under {args.runs_root.name}/",
        "",
        *([readings.read_text().rstrip(), ""] if readings.is_file() else []),
        "## Commands",
        "",
        "```bash",
        f"# the suite's runs: {args.runs_command}",
        *(
            [
                "# the buffer-capacity runs (one at a time, one torch thread each):",
                f"{BUFFER_SIZES} add 0 128 512 256 1024",
                f"{BUFFER_SIZES} add 1 256 128 512 1024",
            ]
            if args.buffers
            else []
        ),
        "# this report (--passk evaluates the policies not yet in passk.json):",
        f"PYTHONPATH=src python benchmarks/findings.py {args.runs_root} {args.out} "
        f"--tasks {' '.join(args.tasks)}"
        + (f" --buffers {args.buffers}" if args.buffers else "")
        + (" --passk" if args.passk else ""),
        "```",
        "",
        "The tables below are generated by `benchmarks/findings.py` from the finished runs "
        "(those with a summary.json); the reading above is written by hand from them. Runs "
        "(variant [seeds]) read:",
        "",
        seeds_line(runs),
        "",
        *whipping_section(runs, args.out / "length_vs_step.png"),
        *entropy_section(runs, args.out / "entropy_vs_step.png"),
        *passk_section(runs, cache, args.out / "passk.png"),
        *buffer_section(runs, args.buffers, args.out / "buffer_capacity.png"),
    ]
    atomic_write_text(args.out / "findings.md", "\n".join(md))
    print(args.out / "findings.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
