"""Replay-buffer micro-benchmark: sample/push latency and memory overhead at N rollouts.

Usage: ``replayrl bench buffer [--n 1000000] [--batch 256] [--repeats 200]``
(or ``python -m replayrl.bench.buffer`` / ``python benchmarks/buffer_bench.py``, same flags).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from replayrl.data.buffer import ReplayBuffer, make_buffer
from replayrl.data.rollout_record import Rollout

PROMPT_LEN, COMPLETION_LEN = 32, 64


def _rss_bytes() -> int:
    """Resident set size now (Linux /proc; falls back to peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_rollouts(n: int, seed: int = 0, chunk: int = 65_536) -> list[Rollout]:
    """``n`` rollouts with their own small tensors (32 prompt ids, 64 completion ids/logprobs).

    Each tensor is a separate allocation (cloned from a row of a chunk), as rollouts sliced
    out of a generation batch and kept would be. About half are correct; versions rise.
    """
    g = torch.Generator().manual_seed(seed)
    out: list[Rollout] = []
    for start in range(0, n, chunk):
        c = min(chunk, n - start)
        prompts = torch.randint(0, 32_000, (c, PROMPT_LEN), generator=g)
        comps = torch.randint(0, 32_000, (c, COMPLETION_LEN), generator=g)
        logps = -torch.rand((c, COMPLETION_LEN), generator=g)
        correct = (torch.rand(c, generator=g) < 0.5).tolist()
        for j, (p, z, lp) in enumerate(
            zip(prompts.unbind(0), comps.unbind(0), logps.unbind(0), strict=True)
        ):
            i = start + j
            out.append(
                Rollout(
                    prompt_ids=p.clone(),
                    completion_ids=z.clone(),
                    behaviour_logprobs=lp.clone(),
                    reward=float(correct[j]),
                    advantage=0.0,
                    correct=correct[j],
                    group_id=i // 16,
                    policy_version=i // 4096,
                    step=i // 4096,
                )
            )
    return out


def _time_ns(fn: Callable[[], Any], repeats: int, warmup: int = 5) -> np.ndarray:
    for _ in range(warmup):
        fn()
    out = np.empty(repeats, dtype=np.int64)
    for k in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        out[k] = time.perf_counter_ns() - t0
    return out


def _summary(ns: np.ndarray) -> dict[str, float]:
    return {"median_us": float(np.median(ns)) / 1e3, "p90_us": float(np.percentile(ns, 90)) / 1e3}


def _fill(buf: ReplayBuffer, rollouts: list[Rollout], chunk: int = 1024) -> float:
    t0 = time.perf_counter()
    for s in range(0, len(rollouts), chunk):
        buf.push(rollouts[s : s + chunk])
    return time.perf_counter() - t0


def run_buffer_bench(n: int = 1_000_000, batch: int = 256, repeats: int = 200) -> dict[str, Any]:
    """Fill ReplayBuffers of capacity ``n`` and time ``sample(batch)`` and single pushes."""
    gc.collect()
    gc.disable()  # a million fresh objects would trigger many full collections
    try:
        rss0 = _rss_bytes()
        t0 = time.perf_counter()
        rollouts = make_rollouts(n)
        spare = make_rollouts(repeats + 10, seed=1)  # pushed one at a time below
        create_s = time.perf_counter() - t0
        rss1 = _rss_bytes()
        mean_nbytes = float(np.mean([r.nbytes() for r in rollouts]))

        results: dict[str, Any] = {"n": n, "batch": batch, "repeats": repeats}
        buf = make_buffer("replay", n, seed=0)
        assert isinstance(buf, ReplayBuffer)
        fill_s = _fill(buf, rollouts)
        rss2 = _rss_bytes()
        results["create_s"] = create_s
        results["fill_s"] = fill_s
        results["fill_us_per_rollout"] = fill_s / n * 1e6
        results["tensor_bytes_per_rollout"] = mean_nbytes
        results["overhead_bytes_per_rollout"] = (rss2 - rss0) / n - mean_nbytes
        results["buffer_rss_bytes_per_rollout"] = (rss2 - rss1) / n
        results["buffer_bytes_per_slot"] = buf.overhead_nbytes() / n

        pb = make_buffer("replay", n, sampler="positive_bias", delta=0.2, seed=0)
        wr = make_buffer("replay", n, with_replacement=True, seed=0)
        assert isinstance(pb, ReplayBuffer) and isinstance(wr, ReplayBuffer)
        _fill(pb, rollouts)
        _fill(wr, rollouts)
        gc.freeze()  # keep the stored objects out of any collection during timing

        it = iter(spare * 2)
        results["uniform"] = {
            "sample": _summary(_time_ns(lambda: buf.sample(batch), repeats)),
            "push1": _summary(_time_ns(lambda: buf.push([next(it)]), repeats)),
        }
        it = iter(spare * 2)
        results["positive_bias_0.2"] = {
            "sample": _summary(_time_ns(lambda: pb.sample(batch), repeats)),
            "push1": _summary(_time_ns(lambda: pb.push([next(it)]), repeats)),
            "candidates": pb.stats()["candidates"],
            "reserve_size": pb.stats()["reserve_size"],
        }
        results["uniform_with_replacement"] = {
            "sample": _summary(_time_ns(lambda: wr.sample(batch), repeats)),
        }
        gc.unfreeze()
    finally:
        gc.enable()
    return results


def print_table(res: dict[str, Any]) -> None:
    print(
        f"ReplayBuffer, N = {res['n']:,} rollouts, batch = {res['batch']}, "
        f"repeats = {res['repeats']}"
    )
    print(f"{'case':<28}{'op':<14}{'median us':>12}{'p90 us':>12}")
    for case in ("uniform", "uniform_with_replacement", "positive_bias_0.2"):
        for op, label in (("sample", f"sample({res['batch']})"), ("push1", "push(1)")):
            if op in res[case]:
                s = res[case][op]
                print(f"{case:<28}{label:<14}{s['median_us']:>12.2f}{s['p90_us']:>12.2f}")
    pb = res["positive_bias_0.2"]
    print(
        f"positive_bias_0.2 candidates: {pb['candidates']:,.0f} "
        f"(correct reserve: {pb['reserve_size']:,.0f})"
    )
    print(
        f"create rollouts: {res['create_s']:.1f} s; fill buffer: {res['fill_s']:.2f} s "
        f"({res['fill_us_per_rollout']:.2f} us/rollout, pushes of 1024)"
    )
    print(f"tensor bytes per rollout (nbytes): {res['tensor_bytes_per_rollout']:.0f}")
    print(
        "overhead per rollout beyond tensor bytes (RSS, rollout objects + tensor headers "
        f"+ buffer): {res['overhead_bytes_per_rollout']:.0f} B"
    )
    print(
        f"  of which the buffer's own bookkeeping: {res['buffer_bytes_per_slot']:.1f} B/slot "
        f"(RSS growth while filling: {res['buffer_rss_bytes_per_rollout']:.1f} B/rollout; "
        "malloc reuses freed temporaries, so this undercounts)"
    )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=int, default=1_000_000, help="rollouts stored")
    ap.add_argument("--batch", type=int, default=256, help="sample size")
    ap.add_argument("--repeats", type=int, default=200, help="timed repeats (median reported)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_arguments(ap)
    args = ap.parse_args(argv)
    print_table(run_buffer_bench(args.n, args.batch, args.repeats))


if __name__ == "__main__":
    main()
