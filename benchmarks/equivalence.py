"""Behaviour-equivalence check for refactors of the loop: short deterministic sync runs.

    # on the code before the change (e.g. a `git archive` of main on PYTHONPATH):
    python benchmarks/equivalence.py record runs/eq-before
    # on the code after it:
    python benchmarks/equivalence.py record runs/eq-after
    python benchmarks/equivalence.py compare runs/eq-before runs/eq-after
    # a run setting on one side only (e.g. a new default's old value):
    python benchmarks/equivalence.py record runs/eq-old --override rollout.generation_impl=generate

Each case is a preset shortened to a few steps with overrides that reach the code paths a
refactor can break (positive-bias sampling, mini-batches, the KL schedule, reincarnation
inside the run, critic warm-up). `compare` asserts that every metric of every step is
identical, except wall-clock fields (time/*, *_seconds, ...), and exits 1 otherwise;
`compare --allow-added` also accepts keys that only the second run has (a feature that adds
metrics), while every key both runs have must still be identical.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"

COMMON = [
    "train.steps=12",
    "eval.every=4",
    "eval.num_prompts=64",
    "train.threads=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.overwrite=true",
]

CASES: dict[str, tuple[str, list[str]]] = {
    "grpo": ("grpo", ["train.mini_batch_size=64"]),
    "replay": (
        "replay",
        ["buffer.sampler=positive_bias", "buffer.delta=0.3", "train.epochs=2"],
    ),
    "remix-grpo": (
        "remix-grpo",
        ["method.remix.reincarnation_step=6", "kl.schedule.start=2", "kl.schedule.every=2"],
    ),
    "ppo": ("ppo", ["critic.warmup_steps=2"]),
    "remix-ppo": (
        "remix-ppo",
        ["method.remix.reincarnation_step=6", "kl.schedule.start=2", "kl.schedule.every=2"],
    ),
    # the group-level sources: extra generation calls, stores, reuse
    "dapo": ("dapo", ["method.dynamic_sampling.max_rounds=3"]),
    "ar3po": ("ar3po", []),
    "exgrpo": ("exgrpo", ["method.exgrpo.start_accuracy=0.0"]),
    # a pool small enough that prompts come back with filled per-prompt buffers
    "repo": ("repo", ["method.repo.prompt_pool=16", "method.repo.min_buffer=4"]),
    "group-replay": ("group-replay", ["method.group_replay.capacity=8"]),
    # the filter, the fill from the signal store, its ESS test and varying batches
    "signal-replay": ("signal-replay-grpo", ["method.signal_replay.target=1.0"]),
}

# where a run ran, not what it computed: its folder, the cache folder its warm start sits in,
# the machine and code it records (the ledger is compared on its own below)
ENVIRONMENT_KEYS = ("run_dir", "accounting", "model_path", "provenance")
# wall-clock measurements differ between any two runs
TIME_KEYS = ("time/", "wall_seconds", "_seconds", "mu_median", "mu/", "throughput", "busy", "idle")


def _timeless(key: str) -> bool:
    return not any(t in key for t in TIME_KEYS)


def record(out: Path, names: list[str], extra_overrides: list[str] | None = None) -> None:
    from replayrl.config.schema import load_config
    from replayrl.run.start import train

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        preset, extra = CASES[name]
        # the checkout's configs/ (a link to the shipped presets): a file path, so that code
        # from before presets had names (the "before" side of a comparison) reads it too
        preset = str(PRESET_DIR / f"{preset}.yaml")
        overrides = [
            *COMMON,
            *extra,
            *(extra_overrides or []),
            f"logging.run_dir={out / 'runs'}",
            f"logging.name={name}",
        ]
        train(load_config(preset, overrides), log=lambda s: None)
        rows = (out / "runs" / name / "metrics.jsonl").read_text()
        (out / f"{name}.jsonl").write_text(rows)
        summary = json.loads((out / "runs" / name / "summary.json").read_text())
        (out / f"{name}.summary.json").write_text(json.dumps(summary, indent=1))
        print(f"{name}: {len(rows.splitlines())} metric rows", flush=True)


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _summary_diffs(a_path: Path, b_path: Path, allow_added: bool = False) -> list[str]:
    """summary.json: every count and accuracy, the evals and the rollout ledger."""
    if not a_path.exists() or not b_path.exists():
        return [f"missing {a_path.name}"] if a_path.exists() != b_path.exists() else []
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    for d in (a, b):  # each eval record carries the clocks at that eval
        d["evals"] = [{k: v for k, v in e.items() if _timeless(k)} for e in d.get("evals", [])]
    if allow_added:  # keys only the second run's eval records have (a new per-eval count)
        b["evals"] = [
            {k: v for k, v in eb.items() if k in ea}
            for ea, eb in zip(a["evals"], b["evals"], strict=False)
        ] + b["evals"][len(a["evals"]) :]
    both = a.keys() if allow_added else a.keys() | b.keys()
    keys = [k for k in both if _timeless(k) and k not in ENVIRONMENT_KEYS]
    out = [
        f"summary {k}: {a.get(k)!r} != {b.get(k)!r}" for k in sorted(keys) if a.get(k) != b.get(k)
    ]
    la, lb = a["accounting"]["ledger"], b["accounting"]["ledger"]
    if allow_added:  # ledger terms only the second run has (a new way rollouts can go)
        lb = {k: v for k, v in lb.items() if k in la}
    if la != lb:
        out.append(f"summary ledger: {la} != {lb}")
    return out


def compare(before: Path, after: Path, names: list[str], allow_added: bool = False) -> int:
    failures = 0
    for name in names:
        ra, rb = _rows(before / f"{name}.jsonl"), _rows(after / f"{name}.jsonl")
        diffs = []
        if len(ra) != len(rb):
            diffs.append(f"{len(ra)} rows before, {len(rb)} after")
        compared = 0
        for i, (a, b) in enumerate(zip(ra, rb, strict=False)):
            added = b.keys() - a.keys() if allow_added else set()
            keys = {k for k in a.keys() | b.keys() if _timeless(k) and k not in added}
            for k in sorted(keys):
                compared += 1
                if not _same(a.get(k), b.get(k)):
                    diffs.append(f"row {i} step {a.get('step')}: {k}: {a.get(k)!r} != {b.get(k)!r}")
        diffs += _summary_diffs(
            before / f"{name}.summary.json", after / f"{name}.summary.json", allow_added
        )
        status = "IDENTICAL" if not diffs else f"DIFFERENT ({len(diffs)})"
        print(f"{name}: {len(ra)} rows, {compared} values compared: {status}")
        for d in diffs[:10]:
            print(f"    {d}")
        failures += bool(diffs)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--cases", nargs="*", default=list(CASES))
    r.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for every case (e.g. rollout.generation_impl=generate)",
    )
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--cases", nargs="*", default=list(CASES))
    c.add_argument("--allow-added", action="store_true", help="accept keys only the second run has")
    args = p.parse_args(argv)
    if args.cmd == "record":
        record(args.out, args.cases, args.override)
        return 0
    return compare(args.before, args.after, args.cases, args.allow_added)


if __name__ == "__main__":
    sys.exit(main())
