"""Why `auto`'s warm-up probe measures batches it never trains on: per batch, the mean squared
norm of its rollouts' per-sample gradients at the probe's last policy, for the batches the
probe's updates trained on and for batches of the same policies it only measured; the ratio
of the two (trained / measured, same policy); and what the alpha / rho estimator reads from
each choice.

    PYTHONPATH=src python benchmarks/probe_batches.py TASK SEED [SEED ...] \
        [--suite heldout] [--variant replay-auto-mu5.3] [--batches 3]

Replays the probe of the suite's `variant` on TASK with design.probe_batches = `batches`
(run/loops/design_probe.py: design.warmup_steps updates, each on its own warm-up batch, and
`batches` measured batches at every policy), takes the per-sample gradients of the trained
batches too, and restores the weights. Estimates (data/staleness.py) on:
  trained: the batch each update trained on, plus one fresh batch (the probe's design until
           2026-12-01);
  measured x1: one measured batch per policy (design.probe_batches = 1, the default);
  measured xK: all `batches` measured batches per policy.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from replayrl.bench.suite import load_suite, variant_config
from replayrl.design.staleness import MIN_SIGNAL, estimate_alpha_rho
from replayrl.learner.grad_probe import sample_gradients
from replayrl.run.loops.probe import WarmupProbe
from replayrl.run.session import Session


def outcome(grads: np.ndarray, staleness: np.ndarray, clusters: np.ndarray) -> str:
    est = estimate_alpha_rho(grads, staleness, clusters)
    curve = ", ".join(f"{v:.3g}" for v in est.sigma2)
    if est.ok:
        return f"alpha {est.alpha:.2f} rho {est.rho:.3f} (sigma2 {curve})"
    if "falls" in est.reason:
        return f"falls (sigma2 {curve})"
    return "no signal" if "signal" in est.reason else est.reason


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task")
    ap.add_argument("seeds", nargs="+", type=int)
    ap.add_argument("--suite", default="heldout", help="a suite name or file with TASK")
    ap.add_argument("--variant", default="replay-auto-mu5.3")
    ap.add_argument("--batches", type=int, default=3, help="measured batches per policy")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cfg = variant_config(suite, args.variant, seed, Path(tmp), task=args.task)
            cfg = cfg.model_copy(deep=True)
            cfg.design.probe_batches = args.batches
            run = Path(tmp) / f"run{seed}"
            run.mkdir()
            s = Session(cfg, run, log=lambda *_: None)
            probe = WarmupProbe(s)
            trained = []
            for _ in range(cfg.design.warmup_steps):
                trained.append(s.produce()[0])
                probe.update(trained[-1])
            probe._measure()  # the last policy's batches, as finish() takes them
            # (kind, index among its kind, rollouts): trained batches, then measured ones
            batches = [("trained", i, b) for i, b in enumerate(trained)]
            batches += [("measured", i, b) for i, b in enumerate(probe.measured)]
            rows = [(j, r) for j, (_, _, b) in enumerate(batches) for r in b]
            grads = sample_gradients(s.learner, [r for _, r in rows], seed=cfg.train.seed)
            version = s.learner.version
            probe.restore()
            batch_of = np.array([j for j, _ in rows])
            stale = np.array([version - r.policy_version for _, r in rows])
            pairs = np.array([(j, r.group_id) for j, r in rows]).reshape(-1, 2)
            clusters = np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)
            sq = (grads**2).sum(axis=1)
            parts = []
            for j, (kind, _, _) in enumerate(batches):
                sel = batch_of == j
                if not sel.any():  # every rollout of the batch dropped
                    parts.append(f"{kind[0]}-:empty")
                    continue
                live = sq[sel] > MIN_SIGNAL
                parts.append(
                    f"{kind[0]}{int(stale[sel][0])}:{sq[sel].mean():.3g}/{live.mean():.2f}"
                )
            k, w = args.batches, cfg.design.warmup_steps
            last = [len(trained) + w * k]  # the first measured batch of the last policy
            old = np.isin(batch_of, list(range(w)) + last)
            one = np.isin(batch_of, [len(trained) + p * k for p in range(w + 1)])
            many = batch_of >= len(trained)
            print(
                f"{args.task} seed {seed}: per batch (t = trained on, m = measured; staleness: "
                f"mean squared gradient norm / share with a nonzero gradient) " + " ".join(parts),
                flush=True,
            )
            # the trained batch's mean squared norm over that of the same policy's measured ones
            shrink = []
            for j, (kind, _, _) in enumerate(batches):
                if kind != "trained" or not (batch_of == j).any():
                    continue
                level = int(stale[batch_of == j][0])
                same = many & (stale == level)
                mine, theirs = sq[batch_of == j], sq[same]
                if mine.max() <= MIN_SIGNAL or theirs.max() <= MIN_SIGNAL:
                    shrink.append(f"staleness {level} no signal")  # all equal rewards: 0 / 0
                    continue
                shrink.append(f"staleness {level} {mine.mean() / theirs.mean():.3g}x")
            print("  trained / measured, same policy: " + ", ".join(shrink), flush=True)
            for name, sel in (("trained", old), ("measured x1", one), (f"measured x{k}", many)):
                print(f"  {name}: {outcome(grads[sel], stale[sel], clusters[sel])}", flush=True)


if __name__ == "__main__":
    main()
