"""train.lr_scheduler: the learner's per-step learning rate (torch LambdaLR), TRL's linear decay
with warm-up reproduced step by step and observed in metrics.jsonl."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from replayrl.config.schema import load_config
from replayrl.learner.learner import Learner
from replayrl.learner.lr_schedule import lr_multiplier, warmup_steps
from replayrl.run import start
from replayrl.run.metrics import read_metrics
from tiny import tiny_config


def test_multipliers_by_hand() -> None:
    # linear, 2 steps, no warm-up: 1e-5 -> 5e-6 at step 2 (the TRL run)
    assert [lr_multiplier("linear", i, 2, 0) for i in range(2)] == [1.0, 0.5]
    # linear with 2 warm-up steps of 6: 0, 1/2, then (6-i)/4
    got = [lr_multiplier("linear", i, 6, 2) for i in range(6)]
    assert got == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    # cosine over 4 steps: 0.5 * (1 + cos(pi * i / 4))
    cos = [lr_multiplier("cosine", i, 4, 0) for i in range(4)]
    assert cos == pytest.approx([1.0, 0.5 * (1 + math.sqrt(0.5)), 0.5, 0.5 * (1 - math.sqrt(0.5))])
    assert [lr_multiplier("constant", i, 4, 1) for i in range(3)] == [0.0, 1.0, 1.0]
    assert warmup_steps(10, 0, 0.25) == 3 and warmup_steps(10, 2, 0.9) == 2  # ceil; steps win
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_multiplier("step", 0, 1, 0)


def test_the_learning_rate_in_metrics_follows_the_schedule(tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path,
        "train.steps=4",
        "train.lr=1e-3",
        "train.lr_scheduler=linear",
        "train.warmup_steps=1",
        "train.threads=1",
        "logging.name=lin",
    )
    start.train(cfg, log=lambda _: None)
    steps = [r for r in read_metrics(tmp_path / "lin" / "metrics.jsonl") if r["step"] > 0]
    lrs = [r["train/lr"] for r in steps]
    # warm-up step 0, then (4 - i) / 3 of 1e-3
    assert lrs == pytest.approx([0.0, 1e-3, 2e-3 / 3, 1e-3 / 3])


def test_presets_keep_a_constant_rate(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "train.steps=2", "train.threads=1", "logging.name=c")
    assert cfg.train.lr_scheduler == "constant"
    start.train(cfg, log=lambda _: None)
    steps = [r for r in read_metrics(tmp_path / "c" / "metrics.jsonl") if r["step"] > 0]
    assert [r["train/lr"] for r in steps] == [cfg.train.lr] * 2


@pytest.mark.parametrize(
    ("ratio", "want"), [(0.5, [0.0, 0.5, 1.0, 0.5]), (0.0, [1.0, 0.75, 0.5, 0.25])]
)
def test_warmup_ratio_sets_the_learners_warm_up(
    ratio: float, want: list[float], tiny_model, char_tokenizer
) -> None:
    """train.warmup_ratio (warmup_steps unset) reaches the learner's schedule: 4 steps at
    ratio 0.5 warm up for ceil(0.5 x 4) = 2 (0, 1/2 of lr), then decay linearly, (4 - i) / 2;
    at ratio 0 the decay starts at once, (4 - i) / 4."""
    cfg = load_config(
        None,
        [
            "train.steps=4",
            "train.lr=1e-3",
            "train.lr_scheduler=linear",
            f"train.warmup_ratio={ratio}",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=2",
        ],
    )
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, cfg)
    lrs = []
    for step in range(1, 5):
        learner.lr_schedule.set_step(step)
        lrs.append(learner.optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-3 * w for w in want])
