"""`replayrl bench SUITE`: named variants x seeds on one task, run one after another, then a
summary (median and IQR over seeds), a Markdown table and plots.

A suite (a shipped name: src/replayrl/config/suites/<name>.yaml, or a path) names a baseline and its
variants, each a preset (a shipped name or a path) plus dotted overrides; `quick_overrides`
shrink every run for `--quick`. The target accuracy is the baseline's median final eval
accuracy; each variant is scored by the generated rollouts (and tokens, wall seconds) it needed
to first reach it.

Evaluations happen every `eval.every` steps, so a variant generating fewer rollouts per step R
would be evaluated on a finer rollout grid and reach a threshold "earlier" by construction. A
suite-level `eval_every_rollouts: K` puts every variant on the same grid: each variant gets
`eval.every = K / R` (R = rollout.prompts_per_step x rollout.num_generations of its resolved
config, added as the last override, so it is part of the run's saved config); K must be a
multiple of every variant's R (ConfigError otherwise). `quick_eval_every_rollouts` replaces K
under `--quick` (default: K itself). `quick_final_overrides` apply under `--quick` after each
variant's own overrides (a grid whose cells set their own train.steps).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from replayrl.bench.baseline import choose_baseline
from replayrl.bench.evidence import (
    PLACEBO,
    PLACEBO_SEED_OFFSET,
    across_tasks,
    check_blocks,
    evidence_table,
    run_record,
    task_evidence,
    write_run_record,
)
from replayrl.bench.robust import robust_over_tasks, robust_score, robust_table
from replayrl.bench.targets import (
    HEADLINE,
    HEADROOM_CEILING,
    HEADROOM_MIN_GAIN,
    PAPER_MU,
    gain_table,
    headroom,
    over_tasks,
    score_against_gain,
    stats,
    trained_rollouts_at,
    tuning_choice,
    tuning_lines,
)
from replayrl.config.schema import ConfigError, config_to_yaml, load_config
from replayrl.run.metrics import read_metrics
from replayrl.storage.io import atomic_write_text

COMMON = ["logging.progress=false", "logging.tensorboard=false", "logging.overwrite=true"]
Log = Callable[[str], None]


def load_suite(name_or_path: str) -> dict[str, Any]:
    from replayrl.config.catalog import UnknownNameError, resolve_suite

    try:
        path = resolve_suite(name_or_path)
    except UnknownNameError as exc:
        raise ConfigError(str(exc)) from None
    suite = yaml.safe_load(path.read_text()) or {}
    variants = suite.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{path}: `variants` must map names to {{config, overrides}}")
    baseline = suite.get("baseline", next(iter(variants)))
    if baseline not in variants:
        raise ConfigError(f"{path}: baseline {baseline!r} is not one of the variants")
    for name, v in variants.items():
        if not isinstance(v, dict) or "config" not in v:
            raise ConfigError(f"{path}: variant {name!r} needs a `config` preset path")
    tasks = suite.get("tasks")
    if tasks is not None:
        if not isinstance(tasks, dict) or not tasks:
            raise ConfigError(f"{path}: `tasks` must map task names to {{overrides: [...]}}")
        for tname, t in tasks.items():
            if not isinstance(t, dict) or not isinstance(t.get("overrides", []), list):
                raise ConfigError(f"{path}: task {tname!r} needs an `overrides` list")
        for name, v in variants.items():
            unknown = set(v.get("tasks", [])) - set(tasks)
            if unknown:
                raise ConfigError(f"{path}: variant {name!r} names unknown tasks {sorted(unknown)}")
    suite.setdefault("name", path.stem)
    suite["baseline_stated"] = "baseline" in suite
    suite["baseline"] = baseline
    suite["path"] = str(path)
    choose_baseline(suite)
    if suite.get("placebo"):  # the baseline again on another sampling-seed stream
        if PLACEBO in variants:
            raise ConfigError(f"{path}: `placebo: true` adds a variant {PLACEBO!r}; rename yours")
        variants[PLACEBO] = {
            **variants[suite["baseline"]],
            "seed_offset": PLACEBO_SEED_OFFSET,
            "baseline": suite["baseline"],
        }
    return suite


def first_reaching(summary: dict[str, Any], target: float) -> dict[str, float]:
    """Rollouts, tokens and wall seconds at the first eval with accuracy >= target (inf: never)."""
    for e in summary.get("evals", []):
        if e["eval/accuracy"] >= target - 1e-9:
            return {
                "rollouts": float(e["rollouts_generated"]),
                "tokens": float(e.get("tokens_generated") or math.nan),
                "wall_seconds": float(e["wall_seconds"]),
            }
    return {"rollouts": math.inf, "tokens": math.inf, "wall_seconds": math.inf}


def modelled_compute_to(summary: dict[str, Any], target: float, mu: float | None) -> float:
    """Paper 1's cost model at the first eval reaching `target`: mu x generated rollouts +
    trained rollouts, in units of one trained rollout (inf: never reached; NaN: no mu).
    `mu` None: the run's own measured mu."""
    mu = summary.get("mu_median") if mu is None else mu
    if mu is None or not math.isfinite(mu):
        return math.nan
    for e in summary.get("evals", []):
        if e["eval/accuracy"] >= target - 1e-9:
            return mu * float(e["rollouts_generated"]) + trained_rollouts_at(summary, e)
    return math.inf


def finished_run(cfg, run_dir: Path) -> dict[str, Any] | None:
    """The summary of a completed run of exactly this config in `run_dir`, if there is one."""
    summary, saved = run_dir / "summary.json", run_dir / "config.yaml"
    if not (summary.is_file() and saved.is_file()):
        return None
    # compared as configs (not text): a saved run stays reusable when new defaulted knobs appear
    done = load_config(saved)
    # where the run was written is not what it ran: the same folder named another way (a
    # relative vs an absolute --out, a moved results folder) must not rerun it over itself
    done.logging.run_dir, done.logging.name = cfg.logging.run_dir, cfg.logging.name
    if cfg.needs_design:  # a run saves the N, B, x, y (and sampling) it resolved from `auto`
        done.buffer.capacity = cfg.buffer.capacity
        done.buffer.with_replacement = cfg.buffer.with_replacement
        done.buffer.staleness_horizon = cfg.buffer.staleness_horizon
        done.buffer.replay_ratio = cfg.buffer.replay_ratio
        done.train.batch_size = cfg.train.batch_size
    if done == cfg:
        data = json.loads(summary.read_text())
        if data.get("steps") == cfg.train.steps or _budget_spent(cfg, data):
            return data
    return None


def _budget_spent(cfg: Any, summary: dict[str, Any]) -> bool:
    """A run with train.rollout_budget ends before train.steps once it has generated that many."""
    budget = cfg.train.rollout_budget
    return budget is not None and summary.get("rollouts_generated", 0) >= budget


def eval_every_rollouts(suite: dict[str, Any], quick: bool) -> int | None:
    """The suite's common evaluation grid in rollouts (None: each variant's own eval.every)."""
    k = suite.get("eval_every_rollouts")
    if quick and suite.get("quick_eval_every_rollouts") is not None:
        k = suite["quick_eval_every_rollouts"]
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"eval_every_rollouts must be a positive integer, got {k!r}")
    return k


def variant_config(
    suite: dict[str, Any],
    name: str,
    seed: int,
    out: Path,
    quick: bool = False,
    task: str | None = None,
):
    """The resolved config of variant `name`, seed `seed` (on suite task `task`, whose
    overrides come after the suite's and before the variant's), with the common eval grid."""
    v = suite["variants"][name]
    overrides = [
        *COMMON,
        *suite.get("overrides", []),
        *(suite["tasks"][task].get("overrides", []) if task is not None else []),
        *(suite.get("quick_overrides", []) if quick else []),
        *v.get("overrides", []),
        # --quick: overrides that must beat the variant's own (a grid cell's train.steps)
        *(suite.get("quick_final_overrides", []) if quick else []),
        # the placebo: the same seed label, another stream of sampling seeds
        f"train.seed={seed + int(v.get('seed_offset', 0))}",
        f"logging.run_dir={out}",
        f"logging.name={name}-s{seed}",
    ]
    cfg = load_config(v["config"], overrides)
    k = eval_every_rollouts(suite, quick)
    if k is None:
        return cfg
    steps = cfg.method_spec.budget_is_steps
    if steps is not None and not steps(cfg):
        # e.g. ReMix's fixed composition: mixing steps generate (1 - p) R, later ones R: the
        # grid is counted in rollouts
        return load_config(v["config"], [*overrides, f"eval.every_rollouts={k}"])
    r = cfg.rollouts_per_step
    if k % r:
        raise ConfigError(
            f"variant {name!r}: eval_every_rollouts={k} is not a multiple of its rollouts per "
            f"step R={r} (rollout.prompts_per_step x rollout.num_generations)"
        )
    return load_config(v["config"], [*overrides, f"eval.every={k // r}"])


def run_one(cfg, peer: str | None, run_dir: Path, log: Log) -> dict[str, Any]:
    if peer == "trl":
        from replayrl.bench.peers.trl_grpo import run_trl_grpo

        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
        return run_trl_grpo(cfg, run_dir, log=log)
    if peer is not None:
        raise ConfigError(f"unknown peer {peer!r} (known: trl)")
    from replayrl.run.start import train

    return train(cfg, log=log)


def variants_on(suite: dict[str, Any], task: str | None, only: list[str] | None) -> list[str]:
    """The variants run on `task` (a variant's `tasks:` list restricts it), in suite order."""
    return [
        k
        for k, v in suite["variants"].items()
        if (not only or k in only) and (task is None or task in v.get("tasks", [task]))
    ]


def run_suite(
    suite: dict[str, Any],
    seeds: list[int],
    out_root: Path,
    quick: bool = False,
    only: list[str] | None = None,
    log: Log = print,
    fresh: bool = False,
    only_tasks: list[str] | None = None,
    no_run: bool = False,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run a suite; with `tasks:` every variant on every task (see `run_multi_task`).
    `no_run`: start nothing, summarise the finished runs (missing ones are listed).
    `jobs` > 1, or any full (not --quick) multi-task suite: run `jobs` runs at once, each in
    its own process, seed by seed (see `run_pending`), then summarise the finished ones; a
    run that fails is reported and left out, not fatal."""
    if not no_run:  # every arm of every seed on a task starts from the same warm start
        plan = planned_runs(suite, seeds, out_root, quick, only, only_tasks)
        # each run's provenance records the hash it started from; a --no-run summary says
        # the same as the run that wrote the runs
        for task, ws in prepare_warmstarts(suite, plan, quick, log).items():
            log(f"{task}: warm start {ws['key']} sha256 {ws['sha256'][:12]} ({ws['source']})")
    # a full multi-task suite runs seed by seed in child processes even one at a time
    # (seed_major: a stopped invocation leaves whole seeds); --quick stays in this process
    if (jobs > 1 or (suite.get("tasks") and not quick)) and not no_run:
        run_pending(suite, seeds, out_root, quick, only, log, fresh, only_tasks, jobs)
        fresh, no_run = False, True  # the summary reads what the runs left on disk
    if suite.get("tasks"):
        return run_multi_task(
            suite, seeds, out_root, quick, only, log, fresh, only_tasks, no_run=no_run
        )
    return _run_task(
        suite, seeds, out_root / suite["name"], quick, only, log, fresh, None, no_run=no_run
    )


def prepare_warmstarts(
    suite: dict[str, Any], plan: list[tuple[str, Any, Any, Path]], quick: bool, log: Log
) -> dict[str, dict[str, Any]]:
    """Build or load one warm start per task before any run starts (run/warmstart.py:
    pinned_warmstart), so every arm of every seed starts from it: from the suite's
    `warmstarts: DIR` (DIR/<task>/, committed safetensors) when it holds one, else built in the
    cache (and, with `pin_warmstarts`, copied into DIR/<task>/ to commit). Refuses a task whose
    variants would start from different warm starts. Runs on a `model.path` need none."""
    from replayrl.run.warmstart import pinned_warmstart, warmstart_key

    by_task: dict[str, list[Any]] = {}
    for label, cfg, _, _ in plan:
        if not cfg.model.path:
            by_task.setdefault(_label_parts(label)[1] or suite["name"], []).append(cfg)
    root = suite.get("warmstarts")
    used = {}
    for task, cfgs in by_task.items():
        keys = {warmstart_key(c.model, c.task) for c in cfgs}
        if len(keys) > 1:
            raise ConfigError(
                f"task {task}: its variants would start from {len(keys)} different warm starts "
                "(model.tiny, model.warmstart or task overrides): every arm must start from one"
            )
        folder = Path(root) / task if root and not quick else None  # --quick: its own
        try:
            used[task] = pinned_warmstart(
                cfgs[0].model, cfgs[0].task, folder, bool(suite.get("pin_warmstarts")), log
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return used


def planned_runs(
    suite: dict[str, Any],
    seeds: list[int],
    out_root: Path,
    quick: bool = False,
    only: list[str] | None = None,
    only_tasks: list[str] | None = None,
) -> list[tuple[str, Any, str | None, Path]]:
    """Every run of the suite as (label, resolved config, peer, run folder), in suite order;
    every config is resolved here, so a bad grid fails before the first run starts."""
    out = out_root / suite["name"]
    tasks: list[str | None] = list(suite["tasks"]) if suite.get("tasks") else [None]
    if only_tasks and suite.get("tasks"):
        tasks = [t for t in tasks if t in only_tasks]
    plan = []
    for task in tasks:
        folder = out / task if task is not None else out
        for name in variants_on(suite, task, only):
            for seed in seeds:
                cfg = variant_config(suite, name, seed, folder, quick, task)
                label = f"{task + '/' if task else ''}{name}-s{seed}"
                peer = suite["variants"][name].get("peer")
                plan.append((label, cfg, peer, folder / f"{name}-s{seed}"))
    return plan


def planned_budget(cfg: Any) -> int | None:
    """Generated rollouts a run will spend: train.rollout_budget, else train.steps x R; None
    when steps x R does not say (the method's `budget_is_steps`: ReMix's fixed composition
    generates (1 - p) R while mixing)."""
    if cfg.train.rollout_budget is not None:
        return int(cfg.train.rollout_budget)
    steps = cfg.method_spec.budget_is_steps
    if steps is not None and not steps(cfg):
        return None
    return int(cfg.train.steps * cfg.rollouts_per_step)


def fairness_problems(suite: dict[str, Any], plan: list[tuple[str, Any, Any, Path]]) -> list[str]:
    """Variants whose groups (rollout.num_generations) or generated-rollout budget differ from
    their baseline's on the same task, unless the suite says why the method sets its own
    (`own_budget: <reason>`: DAPO's over-sampling, AR3PO's rounds, ExGRPO's extra questions)."""
    base_cfg: dict[str, Any] = {}
    for label, cfg, _, _ in plan:
        name, task = _label_parts(label)
        if name == suite["baseline"]:
            base_cfg.setdefault(task, cfg)
    problems, seen = [], set()
    for label, cfg, _, _ in plan:
        name, task = _label_parts(label)
        v = suite["variants"][name]
        b = base_cfg.get(task)
        if b is None or name == suite["baseline"] or v.get("own_budget") or (name, task) in seen:
            continue
        seen.add((name, task))
        where = f"{task + '/' if task else ''}{name}"
        if cfg.method_spec.varying_generation:
            problems.append(
                f"{where}: method.name={cfg.method.name} generates a varying number per "
                "step: say why its budget is its own (`own_budget: <reason>`)"
            )
            continue
        g, gb = cfg.rollout.num_generations, b.rollout.num_generations
        if g != gb:
            problems.append(f"{where}: rollout.num_generations={g}, the baseline's is {gb}")
        n, nb = planned_budget(cfg), planned_budget(b)
        if n is None:
            problems.append(f"{where}: set train.rollout_budget (fixed ReMix batches)")
        elif n != nb:
            problems.append(f"{where}: {n} generated rollouts, the baseline's budget is {nb}")
    return problems


def _label_parts(label: str) -> tuple[str, str | None]:
    """(variant, task) of a plan label `task/variant-sSEED` or `variant-sSEED`."""
    task, _, rest = label.rpartition("/")
    return rest.rsplit("-s", 1)[0], task or None


def check_fairness(
    suite: dict[str, Any], plan: list[tuple[str, Any, Any, Path]], quick: bool, log: Log
) -> None:
    """Refuse (`fair: strict`) or warn loudly (the default) when a variant's groups or budget
    differ from its baseline's; --quick shrinks every run and is not checked."""
    problems = [] if quick else fairness_problems(suite, plan)
    if not problems:
        return
    head = "variants compared at other groups or budgets than the baseline's"
    if suite.get("fair") == "strict":
        raise ConfigError(f"suite {suite['name']}: {head}:\n  " + "\n  ".join(problems))
    for line in problems:
        log(f"WARNING (unfair comparison) {line}")


def seed_major(
    runs: list[tuple[str, Any, str | None, Path]],
) -> list[tuple[str, Any, str | None, Path]]:
    """The runs ordered by seed, suite order kept within a seed (run folders are named
    `<variant>-s<seed>`): an invocation stopped part-way leaves whole seeds, every arm of
    every task, for the table instead of every seed of the first arms only."""
    return sorted(runs, key=lambda run: int(run[3].name.rsplit("-s", 1)[1]))


def interleave_tasks(
    runs: list[tuple[str, Any, str | None, Path]],
) -> list[tuple[str, Any, str | None, Path]]:
    """The runs round-robin over their tasks (run folders' parents), each task's own order
    kept: a task's first run builds its warm start (minutes, under a lock the task's other
    runs wait on), so starting every task early builds them side by side instead of leaving
    all but one job waiting. Runs are deterministic, so the order changes only wall times."""
    by_task: dict[Path, list[tuple[str, Any, str | None, Path]]] = {}
    for run in runs:
        by_task.setdefault(run[3].parent, []).append(run)
    queues = list(by_task.values())
    out = []
    for i in range(max((len(q) for q in queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def _run_in_child(cfg: Any, peer: str | None, run_dir: Path) -> tuple[dict[str, Any], float]:
    """The run's summary and its seconds in the child, all of it (model load, warm start,
    evaluations): a summary's wall_seconds count only the training loop."""
    t0 = time.perf_counter()
    summary = run_one(cfg, peer, run_dir, log=lambda _: None)
    return summary, time.perf_counter() - t0


def run_pending(
    suite: dict[str, Any],
    seeds: list[int],
    out_root: Path,
    quick: bool,
    only: list[str] | None,
    log: Log,
    fresh: bool,
    only_tasks: list[str] | None,
    jobs: int,
) -> dict[str, str]:
    """Run the suite's unfinished runs `jobs` at a time, each in a fresh (spawned) process.

    Sync runs are deterministic for a seed, so a run gives the same rollouts and accuracies
    whichever process runs it; only its wall time depends on what runs beside it. Returns
    {label: "done" | "failed: ..."}; failed runs are logged and left for the summary to list.
    """
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    plan = planned_runs(suite, seeds, out_root, quick, only, only_tasks)
    check_fairness(suite, plan, quick, log)  # the baseline's groups and budget, or say why
    pending = []
    for label, cfg, peer, run_dir in plan:
        if peer == "trl" and not _trl_installed():
            log(f"skipping {label}: TRL is not installed (pip install 'replayrl[bench]')")
        elif fresh or finished_run(cfg, run_dir) is None:
            pending.append((label, cfg, peer, run_dir))
    pending = interleave_tasks(seed_major(pending))
    threads = max((cfg.train.threads or 1) for _, cfg, _, _ in pending) if pending else 1
    cores = os.cpu_count() or 1
    if jobs * threads > cores:
        log(f"note: {jobs} jobs x {threads} torch threads > {cores} cores: wall times will suffer")
    log(f"{len(pending)} of {len(plan)} runs to do, {jobs} at a time")
    status: dict[str, str] = {}
    t_start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {
            pool.submit(_run_in_child, cfg, peer, run_dir): label
            for label, cfg, peer, run_dir in pending
        }
        try:
            for fut in as_completed(futures):
                label = futures[fut]
                try:
                    s, seconds = fut.result()
                except Exception as exc:  # one failed run must not lose the others
                    status[label] = f"failed: {exc!r}"
                    log(f"{label}: FAILED ({exc!r}); left out of the summary")
                    continue
                status[label] = "done"
                log(f"{_result_line(label, s)}, {seconds:.0f}s in all")
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    done = sum(v == "done" for v in status.values())
    minutes = (time.perf_counter() - t_start) / 60
    log(f"{done} of {len(pending)} runs done in {minutes:.1f} min, {jobs} at a time")
    return status


def _result_line(label: str, summary: dict[str, Any]) -> str:
    return (
        f"{label}: final acc {summary['final_eval_accuracy']:.3f}, rollouts "
        f"{summary['rollouts_generated']}, wall {summary['wall_seconds']:.0f}s"
    )


def _trl_installed() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def _run_task(
    suite: dict[str, Any],
    seeds: list[int],
    out: Path,
    quick: bool,
    only: list[str] | None,
    log: Log,
    fresh: bool,
    task: str | None,
    no_run: bool = False,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    variants = {k: suite["variants"][k] for k in variants_on(suite, task, only)}
    # resolve every config first: a bad grid fails before hours of runs, not halfway through
    configs = {
        (name, seed): variant_config(suite, name, seed, out, quick, task)
        for name in variants
        for seed in seeds
    }
    results: dict[str, list[dict[str, Any]]] = {}
    for name, v in variants.items():
        if v.get("peer") == "trl" and not _trl_installed():
            log(f"skipping {name}: TRL is not installed (pip install 'replayrl[bench]')")
            continue
        results[name] = []
        for seed in seeds:
            run_name = f"{name}-s{seed}"
            cfg = configs[name, seed]
            summary = None if fresh else finished_run(cfg, out / run_name)
            if summary is None and no_run:
                log(f"{task + '/' if task else ''}{run_name}: not finished, left out (--no-run)")
                continue
            if summary is not None:
                log(f"{run_name}: reusing the finished run with the same config")
                summary["run_dir"] = str(out / run_name)  # where it is now, if it was moved
            else:
                summary = run_one(cfg, v.get("peer"), out / run_name, log=lambda _: None)
            rows = read_metrics(out / run_name / "metrics.jsonl")
            ent = [m["train/entropy"] for m in rows if m.get("train/entropy") is not None]
            summary["final_entropy"] = ent[-1] if ent else math.nan
            results[name].append(summary)
            record = run_record(summary, task, name, seed, metrics=rows)
            write_run_record(_records_dir(suite, out, task), record)
            log(_result_line(f"{task + '/' if task else ''}{run_name}", summary))
    results = {k: v for k, v in results.items() if v}  # --no-run: variants with no run
    label = {**suite, "name": f"{suite['name']}/{task}"} if task else suite
    return summarise(label, results, seeds, out, quick)


def _records_dir(suite: dict[str, Any], out: Path, task: str | None) -> Path:
    """Where each run's small record goes: `--results DIR` (meant to be committed), else
    `records/` in the suite's run folder; one subfolder per task."""
    if suite.get("results_dir"):
        return Path(suite["results_dir"])
    return (out.parent if task is not None else out) / "records"


def run_multi_task(
    suite: dict[str, Any],
    seeds: list[int],
    out_root: Path,
    quick: bool = False,
    only: list[str] | None = None,
    log: Log = print,
    fresh: bool = False,
    only_tasks: list[str] | None = None,
    no_run: bool = False,
) -> dict[str, Any]:
    """Every variant on every task of `suite["tasks"]` (one folder per task, each with its own
    summary against its own baseline target), then the median over tasks per variant."""
    out = out_root / suite["name"]
    tasks = [t for t in suite["tasks"] if not only_tasks or t in only_tasks]
    if not tasks:
        raise ConfigError(f"none of the tasks {only_tasks} is in the suite")
    planned_runs(suite, seeds, out_root, quick, only, tasks)  # every config resolves first
    per_task = {}
    for t in tasks:
        try:
            per_task[t] = _run_task(suite, seeds, out / t, quick, only, log, fresh, t, no_run)
        except ConfigError as exc:
            if not no_run:
                raise
            log(f"task {t} left out of the summary: {exc}")  # its baseline has no finished run
    if not per_task:
        raise ConfigError("no task has a finished baseline run to summarise")
    return summarise_tasks(suite, per_task, seeds, out, quick)


def _variant_row(runs: list[dict[str, Any]], baseline: str, target: float) -> dict[str, Any]:
    """One variant's figures over its seeds, against `target` (its baseline's accuracy)."""
    reach = [first_reaching(s, target) for s in runs]
    return {
        "baseline": baseline,
        "target_accuracy": target,
        "runs": [s["run_dir"] for s in runs],
        "rollouts_to_target": stats([r["rollouts"] for r in reach]),
        "tokens_to_target": stats([r["tokens"] for r in reach]),
        "wall_seconds_to_target": stats([r["wall_seconds"] for r in reach]),
        "reached_target": sum(math.isfinite(r["rollouts"]) for r in reach),
        "final_eval_accuracy": stats([s["final_eval_accuracy"] for s in runs]),
        "best_eval_accuracy": stats([s["best_eval_accuracy"] for s in runs]),
        "rollouts_generated": stats([s["rollouts_generated"] for s in runs]),
        "generation_seconds": stats([s.get("generation_seconds", math.nan) for s in runs]),
        "training_seconds": stats([s.get("training_seconds", math.nan) for s in runs]),
        "wall_seconds": stats([s["wall_seconds"] for s in runs]),
        "mu": stats(
            [s.get("mu_median") if s.get("mu_median") is not None else math.nan for s in runs]
        ),
        "gamma": stats([_gamma(s) for s in runs]),
        "final_entropy": stats([s["final_entropy"] for s in runs]),
        # modelled, not measured: paper 1's compute = mu x generated + trained rollouts
        "modelled_compute_measured_mu": stats([modelled_compute_to(s, target, None) for s in runs]),
        "modelled_compute_paper_mu": stats(
            [modelled_compute_to(s, target, PAPER_MU) for s in runs]
        ),
    }


def _add_baseline_ratios(row: dict[str, Any], b_runs: list[dict[str, Any]]) -> None:
    """The row's ratios to its baseline measured at the row's target (ppo's own target for
    remix-ppo, even though ppo's row is scored against the suite's default baseline)."""
    b_reach = [first_reaching(s, row["target_accuracy"]) for s in b_runs]
    base_at = {
        "rollouts_to_target": stats([r["rollouts"] for r in b_reach]),
        "wall_seconds_to_target": stats([r["wall_seconds"] for r in b_reach]),
    }
    t = row["target_accuracy"]
    base_at["modelled_compute_measured_mu"] = stats(
        [modelled_compute_to(s, t, None) for s in b_runs]
    )
    base_at["modelled_compute_paper_mu"] = stats(
        [modelled_compute_to(s, t, PAPER_MU) for s in b_runs]
    )
    for key, ratio in (
        ("rollouts_to_target", "rollouts_ratio"),
        ("wall_seconds_to_target", "wall_ratio"),
        ("modelled_compute_measured_mu", "compute_ratio_measured_mu"),
        ("modelled_compute_paper_mu", "compute_ratio_paper_mu"),
    ):
        num, den = row[key]["median"], base_at[key]["median"]
        row[ratio] = num / den if den and math.isfinite(den) else math.nan


def summarise(
    suite: dict[str, Any],
    results: dict[str, list[dict[str, Any]]],
    seeds: list[int],
    out: Path,
    quick: bool,
) -> dict[str, Any]:
    base = suite["baseline"]
    if base not in results:
        raise ConfigError(f"the baseline {base!r} was not run")
    # a variant may name its own baseline (e.g. remix-ppo against ppo); default: the suite's
    baseline_of = {
        name: suite["variants"][name].get("baseline", base) if name in suite["variants"] else base
        for name in results
    }
    baseline_of = {k: (v if v in results else base) for k, v in baseline_of.items()}
    targets = {
        b: statistics.median(s["final_eval_accuracy"] for s in results[b])
        for b in set(baseline_of.values())
    }
    target = targets[base]
    table = {
        name: _variant_row(runs, baseline_of[name], targets[baseline_of[name]])
        for name, runs in results.items()
    }
    for row in table.values():
        _add_baseline_ratios(row, results[row["baseline"]])
    # below the plateau: fractions of the baseline's gain, AUC on a common horizon
    horizon = min(float(s["rollouts_generated"]) for rs in results.values() for s in rs)
    for name, row in table.items():
        row.update(score_against_gain(results[name], results[row["baseline"]], horizon))
        # crossings of a 3-eval trailing mean, final = mean of the last 3 (the intervals of
        # bench/evidence.py are read on these)
        row.update(robust_score(results[name], results[row["baseline"]]))
    summary = {
        "suite": suite["name"],
        "suite_file": suite["path"],
        "baseline": base,
        "target_accuracy": target,
        "seeds": seeds,
        "quick": quick,
        "variants": table,
        "headroom": headroom(results[base]),  # does the task leave room below the plateau?
    }
    if suite.get("tuning"):  # a tuning suite: each method's chosen setting (equal budgets)
        summary["tuning_choice"] = tuning_choice({k: v for k, v in table.items() if k != PLACEBO})
    blocks = check_blocks({suite["name"]: results}, bool(suite.get("mixed")))
    summary["evidence"] = _evidence(results, base)
    summary["blocks"] = {b: list(k) for k, b in blocks.items()}
    if suite.get("baseline_rule"):
        summary["baseline_rule"] = suite["baseline_rule"]
    text = markdown_table(summary)
    if summary["evidence"] is not None:
        name = suite["name"]
        head = evidence_table({name: summary["evidence"]}, {}, base, blocks, _rule(suite))
        text = head + "\n" + DESCRIPTIVE + text
    atomic_write_text(out / "summary.json", json.dumps(_json_safe(summary), indent=2, default=str))
    atomic_write_text(out / "table.md", text)
    return {**summary, "_runs": results}


DESCRIPTIVE = (
    "The tables below are descriptive medians without intervals: the claims are the interval "
    "rule's above. A verdict below (a median final within 0.01 of the baseline's, less than "
    "one evaluation's binomial error) is a point comparison, not a claim.\n\n"
)


def _evidence(results: dict[str, list[dict[str, Any]]], base: str) -> dict[str, Any] | None:
    """The task's intervals (None, said once, where scipy is not installed)."""
    try:
        return task_evidence(results, base)
    except ImportError as exc:
        print(f"note: no intervals in the table: {exc}")
        return None


def _rule(suite: dict[str, Any]) -> str | None:
    return suite.get("baseline_rule")


def _gamma(summary: dict[str, Any]) -> float:
    """Paper 1's gamma from a run's accounting block (NaN when it has none)."""
    g = (summary.get("accounting") or {}).get("gamma")
    return float(g) if g is not None else math.nan


def _json_safe(value: Any) -> Any:
    """Standard JSON has no Infinity/NaN: write null (an unreached target; see `reached_target`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _fmt(s: dict[str, float], digits: int = 3) -> str:
    if s["n"] == 0:
        return "n/a"
    med = "never" if math.isinf(s["median"]) else f"{s['median']:.{digits}g}"
    q25 = "inf" if math.isinf(s["q25"]) else f"{s['q25']:.{digits}g}"
    q75 = "inf" if math.isinf(s["q75"]) else f"{s['q75']:.{digits}g}"
    return f"{med} [{q25}, {q75}]"


def markdown_table(summary: dict[str, Any]) -> str:
    lines = [
        f"Target: each variant's baseline's median final eval accuracy (default baseline "
        f"`{summary['baseline']}`: {summary['target_accuracy']:.3f}); seeds {summary['seeds']}. "
        "Cells: median [q25, q75] over seeds (`never`: the target was not reached; unreached "
        "seeds count as the largest value). Ratios: variant median / its baseline's median "
        "(lower is better).",
        "",
        "| variant | baseline (target) | reached | rollouts to target | ratio | wall s to target "
        "| ratio | final acc | best acc | gen s | train s | mu | final entropy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["variants"].items():
        n = r["final_eval_accuracy"]["n"]
        lines.append(
            f"| {name} | {r['baseline']} ({r['target_accuracy']:.3f}) | "
            f"{r['reached_target']}/{n} | {_fmt(r['rollouts_to_target'], 4)} | "
            f"{r['rollouts_ratio']:.2f} | {_fmt(r['wall_seconds_to_target'])} | "
            f"{r['wall_ratio']:.2f} | {_fmt(r['final_eval_accuracy'])} | "
            f"{_fmt(r['best_eval_accuracy'])} | {_fmt(r['generation_seconds'])} | "
            f"{_fmt(r['training_seconds'])} | {_fmt(r['mu'])} | {_fmt(r['final_entropy'])} |"
        )
    text = "\n".join(lines) + "\n\n" + robust_table(summary["variants"])
    text += "\n" + gain_table(summary["variants"])
    if summary.get("headroom"):
        text += "\n" + headroom_line(summary["suite"], summary["headroom"]) + "\n"
    if summary.get("tuning_choice"):
        text += tuning_lines(summary["tuning_choice"])
    return text


def _finite_or_inf(x: Any) -> float:
    """A ratio as a number: None / NaN (undefined) stays NaN, inf (never reached) stays inf."""
    return math.nan if x is None else float(x)


def summarise_tasks(
    suite: dict[str, Any],
    per_task: dict[str, dict[str, Any]],
    seeds: list[int],
    out: Path,
    quick: bool,
) -> dict[str, Any]:
    """Per-task summaries plus, per variant, the median over tasks of its per-task medians
    (ratios against its baseline on the same task; unreached counts as the largest value)."""
    runs = {t: s.pop("_runs", None) for t, s in per_task.items()}
    blocks = check_blocks({t: r for t, r in runs.items() if r}, bool(suite.get("mixed")))
    names = list(dict.fromkeys(n for s in per_task.values() for n in s["variants"]))
    over: dict[str, Any] = {}
    for name in names:
        rows = {t: s["variants"][name] for t, s in per_task.items() if name in s["variants"]}
        base_final = {
            t: per_task[t]["variants"][r["baseline"]]["final_eval_accuracy"]["median"]
            for t, r in rows.items()
        }
        over[name] = {
            "tasks": list(rows),
            "reached_target": sum(r["reached_target"] for r in rows.values()),
            "runs": sum(r["final_eval_accuracy"]["n"] for r in rows.values()),
            "final_eval_accuracy": stats(
                [r["final_eval_accuracy"]["median"] for r in rows.values()]
            ),
            "final_minus_baseline": stats(
                [r["final_eval_accuracy"]["median"] - base_final[t] for t, r in rows.items()]
            ),
            **{
                key: stats([_finite_or_inf(r[key]) for r in rows.values()])
                for key in (
                    "rollouts_ratio",
                    "wall_ratio",
                    "compute_ratio_measured_mu",
                    "compute_ratio_paper_mu",
                )
            },
            "mu": stats([r["mu"]["median"] for r in rows.values()]),
            **over_tasks(rows),  # below the plateau: 90% of the gain, AUC, non-inferiority
            **robust_over_tasks(rows),  # the same on smoothed crossings
        }
    summary = {
        "suite": suite["name"],
        "suite_file": suite["path"],
        "baseline": suite["baseline"],
        "seeds": seeds,
        "quick": quick,
        "paper_mu": PAPER_MU,
        "tasks": per_task,
        "median_over_tasks": over,
        "blocks": {b: list(k) for k, b in blocks.items()},
    }
    if suite.get("baseline_rule"):
        summary["baseline_rule"] = suite["baseline_rule"]
    text = multi_task_table(summary)
    evidence = {t: s["evidence"] for t, s in per_task.items() if s.get("evidence")}
    if evidence and len(evidence) == len(per_task):
        summary["evidence_over_tasks"] = across_tasks(evidence, runs, suite["baseline"])
        head = evidence_table(
            evidence, summary["evidence_over_tasks"], suite["baseline"], blocks, _rule(suite)
        )
        text = head + "\n" + DESCRIPTIVE + text
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(_json_safe(summary), indent=2, default=str))
    atomic_write_text(out / "table.md", text)
    return summary


def _ratio(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return "never" if math.isinf(x) else f"{x:.2f}"


def multi_task_table(summary: dict[str, Any]) -> str:
    """Per-task rows (one block per task) and a median-over-tasks row per variant."""
    lines = [
        f"Suite `{summary['suite']}`, seeds {summary['seeds']}. Per task: each variant against "
        "its baseline's median final accuracy on that task (rollouts, wall seconds and "
        "modelled compute to reach it, as ratios to the baseline; lower is better). Modelled "
        "compute (paper 1's cost model, not measured): mu x generated rollouts + trained "
        f"rollouts, at each run's measured mu and at mu = {summary['paper_mu']}.",
        "",
        "Robust columns: a target counts as reached when the mean of 3 "
        "consecutive evaluations first reaches it (held: and stays there to the end of the "
        "run); final = mean of the last 3 evaluations; targets at 90% of the baseline's median "
        "gain measured the same way; verdict: non-inferior when that median final is within "
        "0.01 of the baseline's. Gain columns, first-eval crossings and the last "
        "eval: ratios to the baseline at 90% of its median gain (start + 0.9 x (final - "
        "start)), AUC (mean accuracy over the task's shortest run), the verdict on the last "
        "eval. The ratio columns after them are to the baseline's final.",
        "",
        "| task | variant | final (mean of last 3) | **rollouts ratio to 90% gain (mean of 3)** "
        "| held ratio | verdict (mean of last 3) | reached | final acc | rollouts ratio to 90% "
        f"gain (first eval) | modelled ratio to 90% gain (mu={summary['paper_mu']}) | wall ratio "
        "to 90% gain | AUC | verdict | rollouts ratio | wall ratio | modelled ratio "
        f"(measured mu) | modelled ratio (mu={summary['paper_mu']}) | mu |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, s in summary["tasks"].items():
        for name, r in s["variants"].items():
            g = r["to_gain"][str(HEADLINE)]
            lines.append(
                f"| {task} | {name} | {_robust_cells(r)} | "
                f"{r['reached_target']}/{r['final_eval_accuracy']['n']} | "
                f"{_fmt(r['final_eval_accuracy'])} | {_ratio(g['rollouts_ratio'])} | "
                f"{_ratio(g['compute_paper_mu_ratio'])} | {_ratio(g['wall_seconds_ratio'])} | "
                f"{_fmt(r['auc'])} | {'non-inferior' if r['non_inferior'] else 'INFERIOR'} | "
                f"{_ratio(r['rollouts_ratio'])} | "
                f"{_ratio(r['wall_ratio'])} | {_ratio(r['compute_ratio_measured_mu'])} | "
                f"{_ratio(r['compute_ratio_paper_mu'])} | {_fmt(r['mu'])} |"
            )
    for name, r in summary["median_over_tasks"].items():
        lines.append(
            f"| **median over {len(r['tasks'])} tasks** | {name} | {_robust_over_cells(r)} | "
            f"{r['reached_target']}/{r['runs']} | {_fmt(r['final_eval_accuracy'])} | "
            f"{_ratio(r['gain90_rollouts_ratio']['median'])} | "
            f"{_ratio(r['gain90_compute_paper_mu_ratio']['median'])} | "
            f"{_ratio(r['gain90_wall_seconds_ratio']['median'])} | {_fmt(r['auc'])} | "
            f"{'non-inferior' if r['non_inferior'] else 'INFERIOR'} "
            f"({r['non_inferior_tasks']}/{len(r['tasks'])} tasks) | "
            f"{_ratio(r['rollouts_ratio']['median'])} | {_ratio(r['wall_ratio']['median'])} | "
            f"{_ratio(r['compute_ratio_measured_mu']['median'])} | "
            f"{_ratio(r['compute_ratio_paper_mu']['median'])} | {_fmt(r['mu'])} |"
        )
    room = [headroom_line(t, s["headroom"]) for t, s in summary["tasks"].items() if "headroom" in s]
    if room:
        room = [
            "",
            f"Task headroom (the baseline gains >= {HEADROOM_MIN_GAIN}, ends <= "
            f"{HEADROOM_CEILING} and still rises):",
            *room,
        ]
    return "\n".join(lines + room) + "\n"


def _robust_cells(r: dict[str, Any]) -> str:
    """A per-task row's robust cells: final (mean of last 3), smoothed and held ratios to 90%
    of the gain, verdict (n/a: a summary written before these figures)."""
    rb = r.get("robust")
    if rb is None:
        return "n/a | n/a | n/a | n/a"
    c = rb["to_gain"][str(HEADLINE)]
    verdict_text = "non-inferior" if rb["non_inferior"] else "INFERIOR"
    return (
        f"{_fmt(rb['final_mean'])} | {_ratio(c['rollouts_ratio'])} | "
        f"{_ratio(c['rollouts_held_ratio'])} | {verdict_text}"
    )


def _robust_over_cells(r: dict[str, Any]) -> str:
    """The median-over-tasks row's robust cells (medians of the per-task figures)."""
    if "robust_gain90_rollouts_ratio" not in r:
        return "n/a | n/a | n/a | n/a"
    verdict_text = "non-inferior" if r["robust_non_inferior"] else "INFERIOR"
    return (
        f"{r['robust_final_minus_baseline']['median']:+.3f} vs baseline | "
        f"{_ratio(r['robust_gain90_rollouts_ratio']['median'])} | "
        f"{_ratio(r['robust_gain90_held_ratio']['median'])} | {verdict_text} "
        f"({r['robust_non_inferior_tasks']}/{len(r['tasks'])} tasks)"
    )


def headroom_line(task: str, h: dict[str, Any]) -> str:
    """One markdown line: the baseline's final accuracy and last-quarter slope on a task."""
    if h["qualifies"]:
        why = "qualifies"
    elif math.isnan(h["final"]):
        why = "n/a (the baseline has no evals)"
    elif not h["below_ceiling"]:
        why = "saturates"
    elif not h["learns"]:
        why = f"learns too little (gain {h['gain']:+.3f})"
    else:
        why = "not rising over the last quarter"
    slope = h["last_quarter_slope_per_1k"]
    slope_text = "n/a (under two evals)" if math.isnan(slope) else f"{slope:+.3f}"
    return (
        f"- {task}: final {h['final']:.3f}, last-quarter slope {slope_text} per 1,000 "
        f"generated rollouts: {why}"
    )
