"""Robust crossings and finals (bench/robust.py) and the suites' fairness check (bench/suite.py),
against hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from replayrl.bench.robust import (
    final_mean,
    held_crossing,
    robust_over_tasks,
    robust_score,
    smoothed_crossing,
    trailing_means,
)
from replayrl.bench.suite import check_fairness, fairness_problems, load_suite, planned_runs
from replayrl.config.schema import ConfigError

X = [0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
# a noisy curve: one lucky eval (0.6 at 200) then the real climb
Y = [0.1, 0.2, 0.6, 0.3, 0.5, 0.6, 0.55]


def test_trailing_means_by_hand() -> None:
    m = trailing_means(Y)
    assert math.isnan(m[0]) and math.isnan(m[1])
    # (0.1 + 0.2 + 0.6) / 3 = 0.3; (0.2 + 0.6 + 0.3) / 3 = 0.3667; 0.4667; 0.4667; 0.55
    assert m[2:] == pytest.approx([0.3, 1.1 / 3, 1.4 / 3, 1.4 / 3, 1.65 / 3])
    assert trailing_means([0.5, 0.7], window=1) == [0.5, 0.7]
    with pytest.raises(ValueError):
        trailing_means(Y, window=0)


def test_smoothed_crossing_ignores_one_lucky_eval() -> None:
    # the first eval >= 0.45 is the lucky 0.6 at 200; the 3-eval mean first reaches 0.45 at
    # 400 (0.4667)
    assert smoothed_crossing(X, Y, 0.45) == 400.0
    assert smoothed_crossing(X, Y, 0.6) == math.inf  # the mean never gets to 0.6
    assert smoothed_crossing(X, Y, 0.3) == 200.0  # the first full window (0.3 >= 0.3)


def test_held_crossing_restarts_when_the_mean_falls_back() -> None:
    y = [0.0, 0.5, 0.5, 0.5, 0.2, 0.2, 0.5, 0.6, 0.7]
    x = [float(100 * i) for i in range(len(y))]
    # means from i = 2: 0.333, 0.5, 0.4, 0.3, 0.3, 0.433, 0.6: >= 0.4 at 300, falls to 0.3 at
    # 500, and holds from 800 on (0.6) -- 700's 0.433 also holds: 700
    assert smoothed_crossing(x, y, 0.4) == 300.0
    assert held_crossing(x, y, 0.4) == 700.0
    assert held_crossing(x, y, 0.65) == math.inf  # the last mean (0.6) is below


def test_final_mean_of_the_last_three() -> None:
    assert final_mean(Y) == pytest.approx((0.5 + 0.6 + 0.55) / 3)
    assert final_mean([0.4, 0.6]) == pytest.approx(0.5)
    assert math.isnan(final_mean([]))


def _run(ys: list[float], step: float = 100.0) -> dict[str, Any]:
    return {
        "evals": [{"rollouts_generated": step * i, "eval/accuracy": y} for i, y in enumerate(ys)],
        "final_eval_accuracy": ys[-1],
    }


def test_robust_score_against_the_baseline_by_hand() -> None:
    base = [_run([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]), _run([0.1, 0.3, 0.3, 0.5, 0.5, 0.7, 0.7])]
    # baseline finals (mean of last 3): 0.6 and 0.6333 -> median 0.61667; start 0.1
    # 90% target: 0.1 + 0.9 x 0.51667 = 0.565
    fast = [_run([0.1, 0.5, 0.6, 0.6, 0.6, 0.62, 0.6]), _run([0.1, 0.4, 0.6, 0.7, 0.6, 0.6, 0.62])]
    out = robust_score(fast, base)["robust"]
    assert out["final"] == pytest.approx((0.6 + 1.9 / 3) / 2)
    cell = out["to_gain"]["0.9"]
    assert cell["accuracy"] == pytest.approx(0.565)
    # fast: means (0.4, 0.5667, ...) -> 300; (0.3667, 0.5667, ...) -> 300
    assert cell["rollouts"]["median"] == 300.0
    # baseline seed 0 means: 0.2, 0.3, 0.4, 0.5, 0.6 -> 600; seed 1: 0.233 .. 0.5667 at 500,
    # 0.6333 at 600 -> 500; median 550
    assert cell["baseline_rollouts"]["median"] == pytest.approx(550.0)
    assert cell["rollouts_ratio"] == pytest.approx(300 / 550)
    # fast seed 0 finals: (0.6 + 0.62 + 0.6) / 3 = 0.6067; seed 1 (0.6 + 0.6 + 0.62) / 3
    assert out["final_mean"]["median"] == pytest.approx(1.82 / 3)
    assert out["final_minus_baseline"] == pytest.approx(-0.01)
    assert out["non_inferior"]  # -0.010 is within the margin
    over = robust_over_tasks({"a": {"robust": out}, "b": {"robust": out}})
    assert over["robust_gain90_rollouts_ratio"]["median"] == pytest.approx(300 / 550)
    assert over["robust_non_inferior_tasks"] == 2 and over["robust_non_inferior"]


def test_every_suite_variant_gets_the_baselines_groups_and_budget(tmp_path: Path) -> None:
    for name in ("heldout", "tuning"):
        suite = load_suite(name)
        assert suite["fair"] == "strict"
        assert fairness_problems(suite, planned_runs(suite, [0], tmp_path)) == []
    # a variant with other groups or another budget: refused in a strict suite ...
    suite = load_suite("heldout")
    suite["variants"]["short"] = {"config": "grpo", "overrides": ["train.steps=100"]}
    suite["variants"]["groups4"] = {
        "config": "grpo",
        "overrides": [
            "rollout.num_generations=4",
            "rollout.prompts_per_step=16",
            "train.steps=160",
        ],
    }
    plan = planned_runs(
        suite, [0], tmp_path, only=["grpo-p16", "short", "groups4"], only_tasks=["sub6"]
    )
    problems = fairness_problems(suite, plan)
    assert problems == [
        "sub6/short: 12800 generated rollouts, the baseline's budget is 10240",
        "sub6/groups4: rollout.num_generations=4, the baseline's is 8",
    ]
    with pytest.raises(ConfigError, match="other groups or budgets"):
        check_fairness(suite, plan, quick=False, log=print)
    # ... warned about loudly in a suite that does not say `fair: strict`
    suite["fair"] = None
    logs: list[str] = []
    check_fairness(suite, plan, quick=False, log=logs.append)
    assert logs == [f"WARNING (unfair comparison) {p}" for p in problems]
    # a fixed-composition ReMix variant must name its budget; an own_budget reason exempts
    suite["variants"]["remix-nobudget"] = {
        "config": "remix-grpo",
        "overrides": [
            "rollout.prompts_per_step=8",
            "rollout.num_generations=8",
            "method.remix.composition=fixed",
        ],
    }
    suite["variants"]["short"]["own_budget"] = "a reason"
    plan = planned_runs(
        suite, [0], tmp_path, only=["grpo-p16", "short", "remix-nobudget"], only_tasks=["add6"]
    )
    assert fairness_problems(suite, plan) == [
        "add6/remix-nobudget: set train.rollout_budget (fixed ReMix batches)"
    ]


def test_a_run_that_spent_its_rollout_budget_counts_as_finished(tmp_path: Path) -> None:
    import json

    from replayrl.bench.suite import finished_run, variant_config

    suite = load_suite("tuning")
    cfg = variant_config(suite, "remix-grpo.b", 0, tmp_path)
    run = tmp_path / "remix-grpo.b-s0"
    run.mkdir()
    from replayrl.config.schema import config_to_yaml

    (run / "config.yaml").write_text(config_to_yaml(cfg))
    # stopped at step 174 of train.steps = 1000 with the 10,240 budget spent: finished
    (run / "summary.json").write_text(json.dumps({"steps": 174, "rollouts_generated": 10272}))
    assert finished_run(cfg, run) is not None
    # stopped short of the budget (interrupted): not finished
    (run / "summary.json").write_text(json.dumps({"steps": 100, "rollouts_generated": 6000}))
    assert finished_run(cfg, run) is None
