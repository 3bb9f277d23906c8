"""The asynchronous loop draws from the run's batch source, as the synchronous one does:
ReMix's window and reincarnation work in async-local, and the replay-ratio pace holds.

Tiny async-local runs (one generator process); a few steps each."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from replayrl.config.schema import load_config
from replayrl.data.buffer import make_buffer
from replayrl.data.rollout_record import Rollout
from replayrl.methods.remix import RemixSource
from replayrl.run.start import train
from replayrl.storage.checkpoint import latest_checkpoint, load_state
from tiny import TINY_RUN


def _metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "train/loss" in m]


def test_async_local_remix_mixes_the_window_then_reincarnates(tmp_path: Path) -> None:
    # R = B = 8 fresh; p = 0.2: a mixing batch is its fresh rollouts + a quarter as many from
    # the window; reincarnation after 2 steps, then on-policy batches of exactly B = 8
    logs: list[str] = []
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "runtime=async-local",
            f"logging.run_dir={tmp_path}",
            "train.threads=1",
            "train.steps=4",
            "method.name=remix",
            "algorithm.loss_type=mix_ppg",
            "method.remix.composition=additive",  # asynchronous: R fresh per delivery
            "method.remix.off_policy_fraction=0.2",
            "method.remix.num_policies=2",
            "method.remix.reincarnation_step=2",
            "kl.beta=0.01",
            "kl.target=convex",
        ],
    )
    summary = train(cfg, log=logs.append)
    assert any("policy reincarnation at step 2" in line for line in logs), logs
    steps = _metrics(tmp_path / "demo")
    sizes = [m["batch/batch_size"] for m in steps]
    assert len(sizes) == 4
    # step 2: its fresh deliveries (>= 8) plus >= 2 from the window holding step 1's rollouts
    assert sizes[1] >= 10 and steps[1]["batch/age_max"] >= 1
    assert sizes[2:] == [8.0, 8.0]  # after T: the on-policy queue's batch of B
    assert summary["accounting"]["ledger"]["balanced"]


def test_async_local_replay_ratio_paces_the_learner(tmp_path: Path) -> None:
    # y = 0.5: each rollout used at most half a time on average, so before step k the
    # generators must have delivered 2 * k * B; a learner whose count of drawn rollouts never
    # grew would train as soon as the buffer held one batch
    B, y, steps = 8, 0.5, 3
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "runtime=async-local",
            f"logging.run_dir={tmp_path}",
            "train.threads=1",
            f"train.steps={steps}",
            "method.name=replay",
            "buffer.capacity=64",
            f"train.batch_size={B}",
            f"workers.replay_ratio={y}",
        ],
    )
    train(cfg, log=lambda _: None)
    run = tmp_path / "demo"
    for k, m in enumerate(_metrics(run), start=1):
        assert m["rollouts_generated"] >= k * B / y, (k, m["rollouts_generated"])
    counters = load_state(latest_checkpoint(run))["counters"]
    assert counters["rollouts_sampled"] == steps * B


def _rollout(version: int) -> Rollout:
    ids = torch.tensor([1, 2])
    return Rollout(ids, ids, torch.zeros(2), 1.0, 0.0, True, 0, version, version)


def test_remix_pending_deliveries_survive_a_checkpoint_and_count_in_the_ledger() -> None:
    cfg = load_config(
        None,
        ["method.name=remix", "algorithm.loss_type=mix_ppg", "method.remix.composition=additive"],
    )
    window = make_buffer("replay", 16)
    src = RemixSource(make_buffer("onpolicy", None), window, 8, cfg.method.remix)
    src.push([_rollout(0) for _ in range(3)])
    assert src.available() == 3 and len(src.buffer) == 0  # mixing: held for the next batch
    assert sum(b.stats()["size"] for b in src.buffers()) == 3
    again = RemixSource(
        make_buffer("onpolicy", None), make_buffer("replay", 16), 8, cfg.method.remix
    )
    again.load_state_dict(src.state_dict())
    batch, passes = again.sample(version=1)
    assert len(batch) == 3 and passes == cfg.method.remix.utd and again.available() == 0


def test_remix_pending_deliveries_past_the_staleness_bound_are_dropped_and_counted() -> None:
    from types import SimpleNamespace

    from replayrl.run.state import Counters, ledger

    cfg = load_config(
        None,
        ["method.name=remix", "algorithm.loss_type=mix_ppg", "method.remix.composition=additive"],
    )
    queue = make_buffer("onpolicy", None, max_staleness=1)
    src = RemixSource(queue, make_buffer("replay", 16), 8, cfg.method.remix)
    src.push([_rollout(0) for _ in range(3)] + [_rollout(4) for _ in range(2)])
    c = Counters(rollouts_generated=5)
    src.before_step(SimpleNamespace(version=5), c, lambda _: None)  # bound 1: version >= 4
    batch, _ = src.sample(version=5)
    assert [r.policy_version for r in batch] == [4, 4]
    led = ledger(c, src.buffers())
    assert led["dropped_stale"] == 3 and led["balanced"]
    again = RemixSource(make_buffer("onpolicy", None, max_staleness=1), None, 8, cfg.method.remix)
    again.load_state_dict(src.state_dict())
    assert again.pending_dropped_stale == 3
