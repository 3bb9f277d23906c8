"""The loop with a replay buffer: AsymRE, replay metrics, exact resume, `auto` design, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.cli.main import main
from replayrl.config.schema import load_config
from replayrl.run.metrics import read_metrics
from replayrl.run.start import resume, train
from replayrl.storage.checkpoint import load_state
from tiny import tiny_config

REPLAY = ["method.name=replay", "buffer.capacity=16", "train.batch_size=12"]


def _cfg(tmp_path: Path, name: str, *extra: str):
    return tiny_config(tmp_path, f"logging.name={name}", *extra)


def test_replay_run_logs_buffer_metrics_and_respects_capacity(tmp_path: Path) -> None:
    summary = train(_cfg(tmp_path, "r", *REPLAY, "train.steps=4", "algorithm.loss_type=asymre"))
    steps = [m for m in read_metrics(tmp_path / "r" / "metrics.jsonl") if "train/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    sizes = [m["buffer/size"] for m in steps]
    assert sizes == [8, 16, 16, 16]  # R = 8 per step, FIFO capped at N = 16
    # sampling without removal: from step 2 on the batch holds B = 12 of the 16 stored
    assert all(m["batch/batch_size"] == 12 for m in steps[1:])
    assert steps[0]["batch/batch_size"] == 8  # only 8 present at step 1
    assert max(m["batch/age_max"] for m in steps) >= 1  # older versions are replayed
    assert all(0 < m["train/ess"] <= 1 for m in steps)
    assert summary["rollouts_generated"] == 32
    assert summary["mu_median"] is not None and summary["mu_median"] > 0


def test_replay_resume_continues_exactly(tmp_path: Path) -> None:
    # the format reward is non-zero for a near-random model, so losses are not all 0.0
    extra = [
        *REPLAY,
        "train.epochs=2",
        "train.mini_batch_size=6",
        "rewards=[{name: digits_format}]",
    ]
    train(_cfg(tmp_path, "straight", *extra, "train.steps=4"))
    train(_cfg(tmp_path, "split", *extra, "train.steps=2"))
    summary = resume(tmp_path / "split", ["train.steps=4"], log=lambda _: None)
    assert summary["steps"] == 4 and summary["policy_version"] == 4

    def per_step(name: str) -> dict[int, dict]:
        rows = read_metrics(tmp_path / name / "metrics.jsonl")
        return {m["step"]: m for m in rows if "train/loss" in m}

    a, b = per_step("straight"), per_step("split")
    assert a[3]["train/loss"] != 0.0 and a[3]["train/loss"] != a[4]["train/loss"]
    for step in (3, 4):
        for key in ("reward/mean", "train/loss", "batch/age_mean", "buffer/size"):
            assert a[step][key] == b[step][key], (step, key)
    state_a = load_state(tmp_path / "straight/checkpoints/step_000004")
    state_b = load_state(tmp_path / "split/checkpoints/step_000004")

    def contents(state: dict) -> list[tuple[int, int, int]]:
        table, order = state["buffer"]["rollouts"], state["buffer"]["order"]
        return [(table[j]["group_id"], table[j]["step"], table[j]["times_sampled"]) for j in order]

    assert len(contents(state_a)) == 16
    assert contents(state_a) == contents(state_b)
    assert state_a["buffer"]["rng"] == state_b["buffer"]["rng"]


def test_auto_design_resolves_capacity_and_batch(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        "auto",
        "method.name=replay",
        "buffer.capacity=auto",
        "train.batch_size=auto",
        "train.steps=2",
        "design.warmup_steps=1",
    )
    summary = train(cfg)
    d = summary["design"]
    assert d["mu"] > 0 and d["N"] >= 1 and d["B"] >= 1
    saved = load_config(tmp_path / "auto" / "config.yaml")
    assert saved.buffer.capacity == d["N"] and saved.train.batch_size == d["B"]
    # the warm-up generation counts: one measured step plus the two training steps
    assert summary["rollouts_generated"] == 3 * 8


def test_auto_capacity_needs_replay() -> None:
    with pytest.raises(ValueError, match="buffer.capacity=auto needs method.name=replay"):
        load_config(None, ["buffer.capacity=auto"])


def test_design_cli_prints_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    # mu=4, alpha=0.25, rho=0.5: y* = (sqrt(17)-1)/2 = 1.5616, x* = 5 - sqrt(17) = 0.8769
    rc = main(
        ["design", "--mu", "4", "--alpha", "0.25", "--rho", "0.5", "--rollouts-per-step", "64"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "x*    = 0.8769" in out and "y*    = 1.562" in out
    assert "N = round(x* R) = 56" in out and "B = round(y* R) = 100" in out


def test_summary_json_matches_return(tmp_path: Path) -> None:
    summary = train(_cfg(tmp_path, "s", "train.steps=1"))
    on_disk = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert on_disk["rollouts_generated"] == summary["rollouts_generated"] == 8
