"""Spool file save/load time for one delivery of 64 rollouts: pickle vs. safe formats.

    PYTHONPATH=src python benchmarks/spool_bench.py [--repeats 30] [--completion 256]

Formats, timed side by side (interleaved, medians over repeats):
- pickle: torch.save + torch.load(weights_only=False) (the old spool format; runs code)
- weights_only: torch.save + torch.load(weights_only=True) (restricted unpickler)
- safe: safetensors with the JSON structure in its header (replayrl.storage.safe_state, current)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from replayrl.data.rollout_record import Rollout
from replayrl.run.loops.pool import Delivery
from replayrl.storage.safe_state import dumps_single, loads_single


def delivery(n: int, prompt: int, completion: int) -> Delivery:
    g = torch.Generator().manual_seed(0)
    rollouts = [
        Rollout(
            prompt_ids=torch.randint(0, 50000, (prompt,), generator=g),
            completion_ids=torch.randint(0, 50000, (completion,), generator=g),
            behaviour_logprobs=torch.randn(completion, generator=g),
            reward=1.0,
            advantage=0.5,
            correct=bool(i % 2),
            group_id=i // 8,
            policy_version=3,
            step=3,
            completion_text="x" * (completion * 3),
            prompt_text="p" * (prompt * 3),
        )
        for i in range(n)
    ]
    return Delivery(0, 0, 1, 3, rollouts, {"reward/mean": 0.5}, n, n * completion, 0, 0, None, 1, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = delivery(a.rollouts, a.prompt, a.completion)
    plain = d.to_plain()
    times: dict[str, list[tuple[float, float]]] = {"pickle": [], "weights_only": [], "safe": []}
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "d"
        for _ in range(a.repeats):
            for fmt in times:
                t0 = time.perf_counter()
                if fmt == "safe":
                    p.write_bytes(dumps_single(plain))
                else:
                    torch.save(plain, p)
                t1 = time.perf_counter()
                if fmt == "safe":
                    back = Delivery.from_plain(loads_single(p.read_bytes()))
                else:
                    back = Delivery.from_plain(torch.load(p, weights_only=fmt == "weights_only"))
                t2 = time.perf_counter()
                assert len(back.rollouts) == a.rollouts
                times[fmt].append((t1 - t0, t2 - t1))
    base = statistics.median(s + lo for s, lo in times["pickle"])
    print(
        f"{a.rollouts} rollouts, prompt {a.prompt} + completion {a.completion} tokens, "
        f"{a.repeats} repeats (medians)"
    )
    for fmt, ts in times.items():
        save = statistics.median(s for s, _ in ts) * 1e3
        load = statistics.median(lo for _, lo in ts) * 1e3
        tot = statistics.median(s + lo for s, lo in ts)
        ratio = tot / base
        print(f"{fmt:>13}: save {save:6.2f} ms  load {load:6.2f} ms  total/pickle {ratio:.2f}x")


if __name__ == "__main__":
    main()
