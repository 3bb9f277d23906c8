"""What the `auto` warm-up probe's batches look like at its last policy: per staleness level,
the share of completion tokens whose ratio pi / pi_old left the clip range [0.8, 1.2], the mean
|ratio - 1|, and the share of rollouts with a nonzero advantage (groups with unequal rewards).

    PYTHONPATH=src python benchmarks/probe_clip.py TASK SEED [SEED ...] [--suite heldout]

Replays the probe of the suite's `replay-auto-mu5.3` variant on TASK (design.warmup_steps
updates, then one fresh batch), as recipes/design_probe.py does, and restores the weights.
Used to test why the measured gradient spread falls with staleness (BENCHMARKS.md "`auto`
checked against its own noise"). Shows the batches the probe's updates trained on; since the
seventh session the probe also generates measured batches before each update, so a rerun draws
other batches than the committed output (`benchmarks/probe_batches.py` compares the two).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from replayrl.bench.suite import load_suite, variant_config
from replayrl.design.probe import WarmupProbe
from replayrl.learner.batching import collate
from replayrl.learner.logprobs import token_logprobs_full
from replayrl.run.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task")
    ap.add_argument("seeds", nargs="+", type=int)
    ap.add_argument("--suite", default="heldout", help="a suite name or file with TASK")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cfg = variant_config(suite, "replay-auto-mu5.3", seed, Path(tmp), task=args.task)
            run = Path(tmp) / f"run{seed}"
            run.mkdir()
            s = Session(cfg, run, log=lambda *_: None)
            probe = WarmupProbe(s)
            trained = []  # the batches the probe's updates train on
            for _ in range(cfg.design.warmup_steps):
                trained.append(s.produce()[0])
                probe.update(trained[-1])
            fresh, _ = s.produce()
            parts = []
            for batch in [*trained, fresh]:
                b = collate(batch, s.learner.pad_id)
                with torch.no_grad():
                    logps, _ = token_logprobs_full(s.learner.model, b, cfg.rollout.temperature)
                ratio = (logps - b["old_logprobs"]).exp()[b["mask"].bool()]
                clipped = ((ratio < 0.8) | (ratio > 1.2)).float().mean().item()
                live = sum(r.advantage != 0 for r in batch) / len(batch)
                stale = s.learner.version - batch[0].policy_version
                parts.append(
                    f"staleness {stale}: clipped {clipped:.3f}, |ratio - 1| "
                    f"{(ratio - 1).abs().mean().item():.3f}, nonzero advantage {live:.2f}"
                )
            probe.restore()
            print(f"{args.task} seed {seed}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
