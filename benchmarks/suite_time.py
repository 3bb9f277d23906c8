"""Where a held-out suite run's time goes, three checks.

    PYTHONPATH=src python benchmarks/suite_time.py profile [--task sub5m2]
    PYTHONPATH=src python benchmarks/suite_time.py precision [--task sub5m2] [--steps 24]
    PYTHONPATH=src python benchmarks/suite_time.py attention

`profile`: torch.profiler tables (one thread, as the suite's jobs run) of one evaluation pass
(200 prompts, greedy) and one GRPO training step of the suite's `grpo` variant on `--task`,
built exactly as the suite builds it. `precision`: a short run of that variant in fp32 and
with bf16 generation and learner autocast, alternating, twice each; prints the medians of
whole-run, generation, training and evaluation seconds and their ratios. `attention`: one
decode step's attention (query length 1 against an L-long KV cache) through SDPA with an
additive mask against a hand-written matmul-softmax-matmul, at the suite's shapes.
Run on an otherwise idle machine; tag the figures with its CPU (`lscpu`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from replayrl.bench.suite import load_suite, variant_config


def _config(task: str, out: Path, extra: list[str]):
    suite = load_suite("heldout")
    base = suite["variants"][suite["baseline"]]
    suite["variants"]["timed"] = {
        "config": base["config"],
        "overrides": [*base.get("overrides", []), *extra],
    }
    return variant_config(suite, "timed", 0, out, task=task)


def profile(task: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from replayrl.run.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        s = Session(_config(task, Path(tmp), []), run, log=lambda *_: None)
        torch.set_num_threads(1)
        s.evaluate()  # warm
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            s.evaluate()
        print("one evaluation pass:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        rollouts, _ = s.produce()
        rng = np.random.default_rng(0)
        s.learner.train_step(rollouts, rng, step=1)  # warm
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            s.learner.train_step(rollouts, rng, step=2)
        print("one training step:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def precision(task: str, steps: int) -> None:
    from replayrl.run.start import train

    settings = {
        "fp32": [],
        "bf16": ["precision.generation=bfloat16", "precision.learner_autocast=bfloat16"],
    }
    keys = ("wall", "generation_seconds", "training_seconds", "eval_seconds")
    seen: dict[str, list[tuple[float, ...]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(2):
            for name, extra in settings.items():
                out = Path(tmp) / f"{name}{rep}"
                cfg = _config(task, out, [f"train.steps={steps}", *extra])
                t0 = time.perf_counter()
                summary = train(cfg, log=lambda *_: None)
                summary["wall"] = time.perf_counter() - t0
                seen[name].append(tuple(float(summary[k]) for k in keys))
                print(name, rep, dict(zip(keys, seen[name][-1], strict=True)), flush=True)
    for i, key in enumerate(keys):
        fp32 = statistics.median(r[i] for r in seen["fp32"])
        bf16 = statistics.median(r[i] for r in seen["bf16"])
        print(f"{key}: fp32 {fp32:.1f} s, bf16 {bf16:.1f} s, fp32 / bf16 = {fp32 / bf16:.2f}")


def _time(fn, repeats: int = 200) -> float:
    for _ in range(10):
        fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e6


def attention() -> None:
    torch.set_num_threads(1)
    heads, head_dim, capacity = 4, 32, 160  # the tiny model's, prompt + 112 new tokens
    for rows in (64, 200):  # a training batch (8 x 8) and an evaluation pass
        for length in (40, 100, 150):
            k_cache = torch.randn(rows, heads, capacity, head_dim)
            v_cache = torch.randn(rows, heads, capacity, head_dim)
            q = torch.randn(rows, heads, 1, head_dim)
            keys, values = k_cache[:, :, :length], v_cache[:, :, :length]
            valid = torch.rand(rows, length) > 0.2
            mask = torch.zeros(rows, 1, 1, length).masked_fill_(~valid[:, None, None], -1e30)
            scale = head_dim**-0.5

            def sdpa(q=q, keys=keys, values=values, mask=mask, scale=scale):
                return F.scaled_dot_product_attention(q, keys, values, mask, scale=scale)

            def by_hand(q=q, keys=keys, values=values, mask=mask, scale=scale):
                scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale).add_(mask)
                return torch.matmul(scores.softmax(-1), values)

            a, b = _time(sdpa), _time(by_hand)
            gb = 2 * keys.numel() * 4 / (a * 1e-6) / 1e9  # K and V bytes read per call
            print(
                f"rows {rows} L {length}: SDPA {a:.0f} us ({gb:.1f} GB/s of K/V), "
                f"by hand {b:.0f} us ({b / a:.2f}x SDPA's time)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=["profile", "precision", "attention"])
    ap.add_argument("--task", default="sub5m2", help="a task of the heldout suite")
    ap.add_argument("--steps", type=int, default=24, help="precision: training steps per run")
    args = ap.parse_args()
    if args.check == "profile":
        profile(args.task)
    elif args.check == "precision":
        precision(args.task, args.steps)
    else:
        attention()


if __name__ == "__main__":
    main()
