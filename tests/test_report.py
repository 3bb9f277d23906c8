"""Plots that say what they show: title, fixed colours, the headline target, few lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from replayrl.bench import report
from replayrl.bench.report import (
    MAX_LINES,
    headline_target,
    make_report,
    method_color,
    shown_methods,
)

FINALS = {"grpo": 0.6, "replay": 0.7, "remix-grpo": 0.5, "a": 0.8, "b": 0.3, "c": 0.65, "d": 0.1}


def fake_run(root: Path, variant: str, seed: int, final: float) -> Path:
    """A run folder as a finished run leaves it (summary, metrics, config), no training."""
    d = root / f"{variant}-s{seed}"
    d.mkdir(parents=True)
    start = 0.2 + 0.01 * seed
    evals = [
        {"step": s, "eval/accuracy": start + (final - start) * s / 4, "rollouts_generated": 64 * s}
        for s in range(5)
    ]
    summary = {"evals": evals, "final_eval_accuracy": final}
    (d / "summary.json").write_text(json.dumps(summary))
    metrics = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "completion_length": 5.0 + s,
            "rollouts_generated": 64 * s,
        }
        for s in range(1, 5)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    cfg = {"task": {"name": "reasoning", "op": "sub", "digits": 6}, "model": {"path": None},
           "train": {"seed": seed}}  # fmt: skip
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


@pytest.fixture()
def runs(tmp_path: Path) -> list[Path]:
    return [fake_run(tmp_path / "runs", v, s, f) for v, f in FINALS.items() for s in (0, 1)]


def test_a_method_has_one_colour_whatever_is_plotted_beside_it():
    assert method_color("grpo") == "#000000" and method_color("replay") != method_color("grpo")
    assert method_color("my-variant") == method_color("my-variant")  # by name, not by order
    shipped = ["grpo", "replay", "replay-posbias", "remix-grpo", "remix-ppo", "dapo", "ar3po"]
    assert len({method_color(n) for n in shipped}) == len(shipped)


def test_at_most_five_lines_the_baseline_first_then_the_best(runs: list[Path]):
    groups = report.group_runs(runs)
    shown = shown_methods(groups, "grpo")
    assert len(shown) == MAX_LINES == 5
    assert shown == ["grpo", "a", "replay", "c", "remix-grpo"]  # by median final accuracy


def test_the_headline_target_is_ninety_percent_of_the_baselines_gain(runs: list[Path]):
    groups = report.group_runs(runs)
    value, label = headline_target(groups, "grpo")  # type: ignore[misc]
    start = (0.20 + 0.21) / 2  # median of the two seeds' first evals
    assert value == pytest.approx(start + 0.9 * (0.6 - start))
    assert "90% of grpo's gain" in label


def test_report_titles_colours_target_and_small_multiples(
    runs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    seen: dict[str, Any] = {}
    real_save = report._save

    def keep(fig: Any, path: Path) -> Path:
        seen[path.name] = [
            (ax.get_title(), [(ln.get_label(), ln.get_color()) for ln in ax.get_lines()])
            for ax in fig.axes
        ] + [fig._suptitle.get_text() if fig._suptitle else ""]
        return real_save(fig, path)

    monkeypatch.setattr(report, "_save", keep)
    paths = make_report(runs, tmp_path / "plots", baseline="grpo")
    names = {p.name for p in paths}
    for png in (
        "accuracy_vs_rollouts_generated.png",
        "accuracy_vs_rollouts_generated_all.png",  # 7 methods: every one as small multiples
        "reward_mean_vs_step.png",
        "reward_mean_vs_rollouts_generated.png",
        "completion_length_vs_step.png",
        "completion_length_vs_rollouts_generated.png",
    ):
        assert png in names and (tmp_path / "plots" / png).stat().st_size > 1000
    (title, lines), _ = seen["accuracy_vs_rollouts_generated.png"]
    assert "reasoning: sub, 6 digits" in title and "built-in tiny Llama" in title
    assert "seeds 0, 1" in title
    methods = [(lab, col) for lab, col in lines if "(n=" in lab]
    assert len(methods) <= MAX_LINES
    for lab, col in methods:
        assert col == method_color(lab.split(" (n=")[0])
    assert any(lab.startswith("target ") and "90% of grpo's gain" in lab for lab, _ in lines)
    panels = seen["accuracy_vs_rollouts_generated_all.png"][:-1]
    assert len([p for p in panels if p[1]]) == len(FINALS) - 1  # every method but the baseline


def test_an_unknown_baseline_is_a_clear_error(runs: list[Path], tmp_path: Path):
    with pytest.raises(ValueError, match="baseline 'grop' is not among"):
        make_report(runs, tmp_path / "p", baseline="grop")
