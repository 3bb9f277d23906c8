"""Weights & Biases logging beside JSONL and TensorBoard: the same metric names and steps in
all three, the run config, and a resumed run logging into the same W&B run."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from replayrl.api.trainer import ReplayConfig, ReplayTrainer
from replayrl.run.metrics import WANDB_ID_FILE, numeric, read_metrics
from tiny import TINY_RUN

TINY = [*TINY_RUN, "train.threads=1", "eval.every=1"]


class _FakeRun:
    def __init__(self, calls: dict[str, Any]) -> None:
        self.calls = calls

    def log(self, data: dict[str, Any], step: int) -> None:
        if "completions" in data:  # the completions log's table, apart from the metrics
            self.calls["tables"].append((step, data["completions"]))
            return
        self.calls["log"].append((step, dict(data)))

    def finish(self) -> None:
        self.calls["finished"] += 1


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {"init": [], "log": [], "tables": [], "finished": 0}
    module = types.ModuleType("wandb")

    class Table:
        def __init__(self, columns: list[str], data: list[list[Any]]) -> None:
            self.columns, self.data = columns, data

    module.Table = Table  # type: ignore[attr-defined]

    def init(**kwargs: Any) -> _FakeRun:
        calls["init"].append(kwargs)
        return _FakeRun(calls)

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def _tensorboard_tags(run_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_three_sinks_get_the_same_names_and_steps(fake_wandb, tmp_path: Path) -> None:
    run_dir = tmp_path / "wb"
    args = ReplayConfig(
        "grpo",
        output_dir=str(run_dir),
        max_steps=2,
        report_to=["wandb", "tensorboard"],
        overrides=[o for o in TINY if not o.startswith("logging.tensorboard")],
    )
    trainer = ReplayTrainer(args=args, log=lambda _: None)
    trainer.train()
    records = read_metrics(run_dir / "metrics.jsonl")
    expected = [(r["step"], numeric({k: v for k, v in r.items() if k != "step"})) for r in records]
    assert [s for s, _ in expected] == [0, 1, 2] and "train/loss" in expected[1][1]
    assert fake_wandb["log"] == expected  # every finite number, same name, same step
    tb = _tensorboard_tags(run_dir)
    names = {k for _, m in expected for k in m}
    assert set(tb) == names
    for name in names:
        assert tb[name] == [s for s, m in expected if name in m]
    (init,) = fake_wandb["init"]
    assert init["project"] == "replayrl" and init["name"] == "wb" and init["dir"] == str(run_dir)
    assert init["config"] == trainer.config.model_dump(mode="json")  # the whole run config
    assert init["id"] == (run_dir / WANDB_ID_FILE).read_text() and init["resume"] == "allow"
    assert fake_wandb["finished"] == 1
    # the completions log as a W&B Table at step 1 (the first logged step)
    (step, table), *_ = fake_wandb["tables"]
    assert step == 1 and "completion" in table.columns and len(table.data) == 4


def test_resume_logs_into_the_same_wandb_run(fake_wandb, tmp_path: Path) -> None:
    args = ReplayConfig(
        "grpo", output_dir=str(tmp_path / "r"), max_steps=1, report_to="wandb", overrides=TINY
    )
    ReplayTrainer(args=args, log=lambda _: None).train()
    longer = ReplayConfig(
        "grpo", output_dir=str(tmp_path / "r"), max_steps=2, report_to="wandb", overrides=TINY
    )
    ReplayTrainer(args=longer, log=lambda _: None).train(resume_from_checkpoint=True)
    first, second = fake_wandb["init"]
    assert first["id"] == second["id"]
    assert [s for s, _ in fake_wandb["log"]] == [0, 1, 2]


def test_missing_wandb_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), report_to="wandb", overrides=TINY)
    with pytest.raises(ImportError, match=r"replayrl\[wandb\]"):
        ReplayTrainer(args=args, log=lambda _: None).train()


def test_real_wandb_offline_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "off"
    args = ReplayConfig(
        "grpo", output_dir=str(run_dir), max_steps=1, report_to="wandb", overrides=TINY
    )
    ReplayTrainer(args=args, log=lambda _: None).train()
    wandb.teardown()  # the W&B service writes its log file asynchronously: flush it now
    run_id = (run_dir / WANDB_ID_FILE).read_text()
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
    (log_file,) = offline.glob("run-*.wandb")
    data = log_file.read_bytes()
    for name in ("eval/accuracy", "reward/mean", "train/loss", "rollouts_generated"):
        assert name.encode() in data, name
