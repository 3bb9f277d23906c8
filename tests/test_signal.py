"""The no-learning-signal detector: per-step metrics and a warning after K empty steps."""

from __future__ import annotations

import math

import pytest

from replayrl.run.signal import RewardSignalMonitor, start_accuracy_warning


def _step(groups: list[list[float]]) -> list[tuple[int, float]]:
    return [(gid, r) for gid, rs in enumerate(groups) for r in rs]


def test_frac_reward_zero_std_counts_groups_with_equal_rewards() -> None:
    m = RewardSignalMonitor(patience=3)
    rep = m.update(_step([[1, 1, 1], [0, 0, 0], [0, 1, 0], [1, 0, 1]]))
    assert rep.metrics["signal/frac_reward_zero_std"] == pytest.approx(0.5)
    assert rep.metrics["signal/no_signal_steps"] == 0 and rep.warning is None


def test_warns_once_after_patience_steps_without_variance_and_resets() -> None:
    m = RewardSignalMonitor(patience=3)
    empty = _step([[0, 0], [0, 0]])
    reports = [m.update(empty) for _ in range(5)]
    assert [r.warning is not None for r in reports] == [False, False, True, False, False]
    assert "no learning signal for 3 consecutive steps" in reports[2].warning
    assert "all-correct or all-wrong" in reports[2].warning
    assert reports[4].metrics["signal/no_signal_steps"] == 5
    assert reports[4].metrics["signal/frac_reward_zero_std"] == 1.0
    # one step with variance resets the streak; a new streak warns again
    assert m.update(_step([[0, 1], [0, 0]])).metrics["signal/no_signal_steps"] == 0
    again = [m.update(empty) for _ in range(3)]
    assert again[-1].warning is not None
    assert again[-1].metrics["signal/no_signal_total"] == 8


def test_all_correct_groups_also_have_no_signal() -> None:
    m = RewardSignalMonitor(patience=1)
    rep = m.update(_step([[1, 1], [1, 1]]))
    assert rep.warning is not None and "mean reward 1" in rep.warning


def test_groups_of_one_are_judged_over_the_whole_step() -> None:
    m = RewardSignalMonitor(patience=2)
    varied = m.update([(0, 0.0), (1, 1.0), (2, 0.0)])  # PPO: one completion per prompt
    assert math.isnan(varied.metrics["signal/frac_reward_zero_std"])
    assert varied.metrics["signal/no_signal_steps"] == 0
    m.update([(0, 0.0), (1, 0.0)])
    rep = m.update([(0, 0.0), (1, 0.0)])
    assert rep.warning is not None and "every rollout got the same reward" in rep.warning


def test_dropped_rewards_are_ignored_and_patience_is_checked() -> None:
    m = RewardSignalMonitor(patience=1)
    rep = m.update([(0, 1.0), (0, float("nan")), (0, 0.0)])
    assert rep.metrics["signal/frac_reward_zero_std"] == 0.0 and rep.warning is None
    with pytest.raises(ValueError, match="patience"):
        RewardSignalMonitor(patience=0)


def test_start_accuracy_warning() -> None:
    assert start_accuracy_warning(0.05, 200) is None
    msg = start_accuracy_warning(0.0, 200)
    assert msg is not None and "eval accuracy is 0 on 200 prompts" in msg
    assert "model.warmstart.steps" in msg  # the tiny model: its warm start
    real = start_accuracy_warning(
        0.0, 50, tiny_model=False, max_new_tokens=8, completions_file="runs/x/completions.jsonl"
    )
    assert real is not None and "warmstart" not in real
    for hint in ("rollout.max_new_tokens=8", "chat_template", "runs/x/completions.jsonl", "parse"):
        assert hint in real


def test_a_run_without_reward_variance_says_so(tmp_path) -> None:
    """End to end: a barely warm-started model never writes `#answer` on the reasoning task,
    so every reward is 0: the start warning, per-step metrics and the K-step warning."""
    import json

    from replayrl.run.start import train
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "task.name=reasoning",
        "task.reasoning.digits=2",
        "rewards=[{name: final_answer}]",
        "train.steps=3",
        "logging.no_signal_patience=2",
        "logging.name=flat",
    )
    logs: list[str] = []
    summary = train(cfg, log=logs.append)
    assert summary["initial_eval_accuracy"] == 0.0
    assert any("WARNING: the starting policy's eval accuracy is 0" in line for line in logs)
    warned = [line for line in logs if "no learning signal for 2 consecutive steps" in line]
    assert len(warned) == 1 and warned[0].startswith("WARNING at step 2")
    rows = [json.loads(x) for x in (tmp_path / "flat" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "signal/frac_reward_zero_std" in r]
    assert [r["signal/no_signal_steps"] for r in steps] == [1, 2, 3]
    assert all(r["signal/frac_reward_zero_std"] == 1.0 for r in steps)
    assert summary["no_signal_steps"] == 3
    assert summary["evals"][-1]["rollouts_trained"] == 3 * 8


def test_the_monitor_state_survives_a_checkpoint() -> None:
    """A resumed run continues the streak and total (Session checkpoints state_dict())."""
    a = RewardSignalMonitor(patience=3)
    for _ in range(2):
        a.update([(0, 0.0), (0, 0.0)])
    b = RewardSignalMonitor(patience=3)
    b.load_state_dict(a.state_dict())
    ra, rb = a.update([(0, 1.0), (0, 1.0)]), b.update([(0, 1.0), (0, 1.0)])
    assert ra.metrics == rb.metrics and rb.metrics["signal/no_signal_steps"] == 3.0
    assert ra.warning is not None and rb.warning == ra.warning


def test_an_async_run_feeds_the_monitor_its_fresh_deliveries(tmp_path) -> None:
    """async-local: the rollouts delivered since the last learner step are one step's."""
    import json

    from replayrl.run.start import train
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "task.name=reasoning",
        "task.reasoning.digits=2",
        "rewards=[{name: final_answer}]",
        "train.steps=3",
        "train.threads=1",
        "runtime=async-local",
        "logging.name=flat-async",
    )
    summary = train(cfg, log=lambda _: None)
    rows = [
        json.loads(x) for x in (tmp_path / "flat-async" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "signal/no_signal_total" in r]
    assert steps and all(r["signal/frac_reward_zero_std"] == 1.0 for r in steps)
    assert summary["no_signal_steps"] == len(steps) == steps[-1]["signal/no_signal_total"]
