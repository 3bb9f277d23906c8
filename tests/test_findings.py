"""The findings helpers on synthetic metrics, values computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.findings import (
    at_x,
    finished_runs,
    gain,
    median_curve,
    moving_average,
    rollouts_to_target,
    seed_of,
    series,
    volatility,
    window_mean,
)


def test_series_keeps_finite_numbers_only() -> None:
    rows = [
        {"step": 0, "eval/accuracy": 0.25},
        {"step": 1, "completion_length": 40.0},
        {"step": 2, "eval/accuracy": None},
        {"step": 3, "eval/accuracy": float("nan")},
        {"step": 4, "eval/accuracy": True},
        {"step": 5, "eval/accuracy": 0.5},
    ]
    assert series(rows, "eval/accuracy") == ([0.0, 5.0], [0.25, 0.5])
    rows2 = [{"step": 1, "rollouts_generated": 64, "completion_length": 40}]
    assert series(rows2, "completion_length", x="rollouts_generated") == ([64.0], [40.0])


def test_at_x_maps_steps_to_rollouts() -> None:
    acc = ([0.0, 4.0, 8.0, 9.0], [0.1, 0.2, 0.3, 0.4])
    steps_to_rollouts = ([4.0, 8.0], [256.0, 512.0])
    # step 0 -> 0 rollouts; step 9 is not in the mapping and is dropped
    assert at_x(acc, steps_to_rollouts) == ([0.0, 256.0, 512.0], [0.1, 0.2, 0.3])


def test_median_curve_over_common_x() -> None:
    a = ([1.0, 2.0, 3.0], [1.0, 10.0, 5.0])
    b = ([1.0, 2.0], [3.0, 20.0])
    c = ([1.0, 2.0, 4.0], [2.0, 0.0, 9.0])
    assert median_curve([a, b, c]) == ([1.0, 2.0], [2.0, 10.0])
    assert median_curve([a, b]) == ([1.0, 2.0], [2.0, 15.0])  # even count: mean of middle two
    assert median_curve([]) == ([], [])


def test_window_mean_is_half_open() -> None:
    c = ([48.0, 49.0, 50.0, 51.0, 52.0], [10.0, 20.0, 30.0, 40.0, 50.0])
    assert window_mean(c, 48, 50) == pytest.approx(25.0)  # 49, 50
    assert window_mean(c, 50, 60) == pytest.approx(45.0)  # 51, 52
    assert window_mean(c, 60, 70) is None


def test_rollouts_to_target_first_crossing() -> None:
    c = ([0.0, 256.0, 512.0, 768.0], [0.2, 0.6, 0.5, 0.9])
    assert rollouts_to_target(c, 0.6) == 256.0
    assert rollouts_to_target(c, 0.7) == 768.0
    assert rollouts_to_target(c, 0.95) is None


def test_volatility_mean_absolute_step() -> None:
    # |0.5-0.2| + |0.4-0.5| + |0.8-0.4| = 0.3 + 0.1 + 0.4 = 0.8, over 3 changes
    assert volatility([0.2, 0.5, 0.4, 0.8]) == pytest.approx(0.8 / 3)
    assert volatility([0.7, 0.7, 0.7]) == 0.0
    assert volatility([0.5]) is None


def test_gain() -> None:
    assert gain(0.25, 0.75) == pytest.approx(0.5)
    assert gain(None, 0.75) is None


def test_seed_of() -> None:
    assert seed_of("replay-posbias-s2") == ("replay-posbias", 2)
    assert seed_of("grpo-s10") == ("grpo", 10)
    assert seed_of("grpo") is None
    assert seed_of("replay-sx") is None


def test_finished_runs_needs_summary(tmp_path: Path) -> None:
    for name, done in [("grpo-s0", True), ("grpo-s1", False), ("replay-s0", True)]:
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
        if done:
            (d / "summary.json").write_text("{}")
    (tmp_path / "plot.png").write_text("")
    runs = finished_runs(tmp_path)
    assert runs == {"grpo": {0: tmp_path / "grpo-s0"}, "replay": {0: tmp_path / "replay-s0"}}


def test_moving_average_trailing() -> None:
    # [1], [1, 3], [1, 3, 5], [3, 5, 7]
    assert moving_average([1.0, 3.0, 5.0, 7.0], 3) == pytest.approx([1.0, 2.0, 3.0, 5.0])
    assert moving_average([2.0, 4.0], 1) == [2.0, 4.0]
    assert moving_average([], 3) == []
    with pytest.raises(ValueError):
        moving_average([1.0], 0)
