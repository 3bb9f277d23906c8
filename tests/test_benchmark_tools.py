"""benchmarks/ holds tools: each script says what it does and takes --help; the plotting
tools read the suites' and the speed bench's outputs correctly."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_has_a_docstring_and_an_argument_parser(script: Path) -> None:
    source = script.read_text()
    doc = ast.get_docstring(ast.parse(source))
    assert doc and len(doc) > 40, f"{script.name}: no docstring saying what it does"
    delegated = "from replayrl.bench." in source and "import main" in source
    assert "ArgumentParser" in source or delegated, f"{script.name}: no --help"


def _summary(baseline: float, variant: float | None) -> dict:
    def block(median: float | None) -> dict:
        return {"to_gain": {"0.9": {"rollouts": {"median": median}}}}

    return {
        "tasks": {
            "t1": {"baseline": "grpo", "variants": {"grpo": block(baseline), "x": block(variant)}}
        }
    }


def test_plot_targets_ratios_are_rollouts_over_the_baseline_and_inf_for_never() -> None:
    tool = _load("plot_targets")
    assert tool.ratios(_summary(1000.0, 500.0), "0.9") == {"grpo": {"t1": 1.0}, "x": {"t1": 0.5}}
    assert math.isinf(tool.ratios(_summary(1000.0, None), "0.9")["x"]["t1"])
    assert math.isinf(tool.ratios(_summary(1000.0, math.inf), "0.9")["x"]["t1"])


def test_plot_targets_writes_a_png(tmp_path: Path) -> None:
    tool = _load("plot_targets")
    out = tmp_path / "p.png"
    tool.plot(tool.ratios(_summary(1000.0, 500.0), "0.9"), "0.9", out, skip=[])
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_speed_groups_rows_by_section_and_skips_rows_without_a_rate() -> None:
    tool = _load("plot_speed")
    runs = [
        {"rows": [{"section": "generation", "variant": "old", "tok_s": 49.0}]},
        {
            "rows": [
                {"section": "learner", "variant": "new", "tok_s": 76.0},
                {"section": "learner", "variant": "failed", "tok_s": None},
            ]
        },
    ]
    assert tool.sections(runs) == {"generation": [("old", 49.0)], "learner": [("new", 76.0)]}


def _iv(estimate: float, low: float | None, high: float | None) -> dict:
    return {"estimate": estimate, "low": low, "high": high}


def _finals(*finals: float) -> dict:
    """A variant's per-task evidence as the headline table reads it: its runs' finals."""
    return {"finals": list(finals)}


def _over_tasks(ratio: dict, difference: dict, improvement: dict, claim: str, **extra) -> dict:
    """One variant's figures over tasks ("a" and "b") as the suite's summary.json has them."""
    return {
        "tasks": ["a", "b"],
        "ratio": ratio,
        "difference": difference,
        "probability_of_improvement": improvement,
        "claim": claim,
        **extra,
    }


def test_headline_table_prints_the_suites_intervals_and_claims() -> None:
    mod = _load("headline_table")
    iv, nan, runs = _iv, math.nan, _finals
    summary = {
        "baseline": "grpo-p16",
        "seeds": [0, 1, 2],
        "tasks": {
            "a": {
                "evidence": {
                    "variants": {
                        "grpo-p16": runs(0.5, 0.7, 0.6),
                        "remix-grpo": runs(0.6, 0.6, 0.6),
                        "placebo": runs(0.5),
                    }
                }
            },
            "b": {
                "evidence": {
                    "variants": {
                        "grpo-p16": runs(0.2, 0.4, 0.9),
                        "remix-grpo": runs(0.3, 0.3),
                        "placebo": runs(0.4),
                    }
                }
            },
        },
        "evidence_over_tasks": {
            "remix-grpo": _over_tasks(
                iv(0.5, 0.3, math.inf),
                iv(0.01, -0.03, 0.05),
                iv(0.6, 0.4, 0.8),
                "saving not resolved; loss not resolved",
            ),
            # one run a task: no interval, so no placebo verdict either
            "placebo": _over_tasks(
                iv(1.0, nan, nan),
                iv(0.0, nan, nan),
                iv(0.5, None, None),
                "saving not resolved; loss not resolved",
                placebo_consistent=None,
            ),
        },
    }
    text = mod.table(summary)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    remix = rows["| ReMix-GRPO (`remix-grpo`)"]
    assert "| 5 (2-3) |" in remix
    assert "0.50x [0.30x, never]" in remix and "+0.010 [-0.030, +0.050]" in remix
    assert "0.60 [0.40, 0.80]" in remix and remix.endswith("loss not resolved |")
    placebo = rows["| placebo: GRPO again, other sampling seeds"]
    assert "| 2 (1) |" in placebo and "1.00x (no interval)" in placebo
    assert "noise" not in placebo
    assert "a 0.600, b 0.400" in text and "(3 seeds per task)" in text
    summary["evidence_over_tasks"]["placebo"]["placebo_consistent"] = False
    assert "(NOT like noise)" in mod.table(summary)
    summary["tasks"]["b"]["evidence"] = None  # the suite ran without scipy
    with pytest.raises(SystemExit, match=r"tasks without them: \['b'\]"):
        mod.table(summary)


def test_headline_table_reads_never_back_from_summary_json() -> None:
    """summary.json writes +inf (a resample whose median never crosses) as null, like NaN (no
    interval): read back, the ratio's censored upper end must print as `never`, not `-`."""
    import json

    from replayrl.bench.suite import _json_safe

    mod = _load("headline_table")
    iv, nan, runs = _iv, math.nan, _finals
    summary = {
        "baseline": "grpo-p16",
        "tasks": {
            "a": {"evidence": {"variants": {"grpo-p16": runs(0.5, 0.7), "placebo": runs(0.5)}}},
            "b": {"evidence": {"variants": {"grpo-p16": runs(0.2, 0.4), "placebo": runs(0.4)}}},
        },
        "evidence_over_tasks": {
            "replay-posbias": _over_tasks(
                iv(0.7, 0.5, math.inf),
                iv(0.01, -0.03, 0.05),
                iv(0.6, 0.4, 0.8),
                "saving not resolved; loss not resolved",
            ),
            "remix-grpo": _over_tasks(  # every resample's median never crosses
                iv(math.inf, math.inf, math.inf),
                iv(-0.2, -0.3, -0.1),
                iv(0.1, 0.0, 0.2),
                "saving not resolved; lower final",
            ),
            "placebo": _over_tasks(  # one run a task: no interval
                iv(1.0, nan, nan),
                iv(0.0, nan, nan),
                iv(0.5, nan, nan),
                "saving not resolved; loss not resolved",
                placebo_consistent=None,
            ),
        },
    }
    for name in ("replay-posbias", "remix-grpo"):
        for task in ("a", "b"):
            summary["tasks"][task]["evidence"]["variants"][name] = runs(0.5, 0.6)
    read_back = json.loads(json.dumps(_json_safe(summary)))
    text = mod.table(read_back)
    assert text == mod.table(summary)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert "| 0.70x [0.50x, never] |" in rows["| replay, positive bias (`replay`, delta 0.2)"]
    assert "| never [never, never] |" in rows["| ReMix-GRPO (`remix-grpo`)"]
    placebo = rows["| placebo: GRPO again, other sampling seeds"]
    assert "1.00x (no interval)" in placebo and "+0.000 (no interval)" in placebo


def test_bootstrap_coverage_counts_intervals_that_contain_the_truth() -> None:
    pytest.importorskip("scipy")
    mod = _load("bootstrap_coverage")
    # both arms from one distribution: most 90% intervals contain 0, not all (a coverage of
    # 1.0 or near 0 would mean the count or the interval is wired wrong); fixed seeds
    c = mod.coverage(10, trials=60, sd=0.03, seed=1)
    assert 0.7 <= c < 1.0
    assert mod.coverage(2, trials=30, sd=0.03, seed=1) < c  # two runs: far too narrow


def _steps(rollouts: list[float], zero: list[float | None], replayed=None) -> dict:
    return {
        "step": list(range(1, len(rollouts) + 1)),
        "rollouts_generated": rollouts,
        "zero_advantage": zero,
        **({"replayed": replayed} if replayed else {}),
    }


def test_waste_figure_counts_rollouts_in_zero_advantage_groups_by_quarter() -> None:
    tool = _load("waste_figure")
    # spans of 100 rollouts each; shares 1, 0.5, 0.5, 0 (one span a quarter)
    w = tool.wasted(_steps([100, 200, 300, 400], [1.0, 0.5, 0.5, 0.0]))
    assert w["generated"] == 400 and w["wasted"] == 200 and w["share"] == 0.5
    assert w["quarters"] == [1.0, 0.5, 0.5, 0.0]
    # uneven spans weigh by the rollouts they generated: 300 at 0.2 and 100 at 1.0
    w = tool.wasted(_steps([300, 400], [0.2, 1.0]))
    assert w["wasted"] == pytest.approx(160) and w["share"] == pytest.approx(0.4)
    assert w["quarters"] == [None, None, pytest.approx(0.2), pytest.approx(1.0)]
    # a span without the metric (no group had two rollouts) counts as no waste
    assert tool.wasted(_steps([100, 200], [None, 1.0]))["wasted"] == 100


def test_waste_figure_reads_records_draws_and_tabulates(tmp_path: Path, capsys) -> None:
    import json

    tool = _load("waste_figure")
    folder = tmp_path / "runs"
    (folder / "t").mkdir(parents=True)
    records = {
        "grpo-s0": _steps([100, 200, 300, 400], [0.8, 0.6, 0.4, 0.2]),
        "grpo-s1": _steps([100, 200, 300, 400], [0.6, 0.6, 0.2, 0.2]),
        "remix-s0": _steps([100, 200, 300, 400], [0.4, 0.2, 0.2, 0.0], [0.0, 0.25, 0.25, 0.25]),
    }
    for name, steps in records.items():
        (folder / "t" / f"{name}.json").write_text(json.dumps({"step_metrics": steps}))
    (folder / "t" / "grpo-s2.json").write_text(json.dumps({"evals": []}))  # an older record
    (folder / "t" / "grpo-p8-s0.json").write_text(json.dumps({"step_metrics": {}}))  # not grpo's
    out = tmp_path / "waste.png"
    argv = ["--records", str(folder), "--tasks", "t", "--variants", "grpo", "remix"]
    assert tool.main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 records without per-step metrics" in text and "grpo-s2.json" in text
    # grpo: shares 0.5 and 0.4, median 0.45; quarters medians 0.7, 0.6, 0.3, 0.2
    assert "| t | grpo | 2 | 0.45 | 0.70 | 0.60 | 0.30 | 0.20 |" in text
    assert "| t | remix | 1 | 0.20 | 0.40 | 0.20 | 0.20 | 0.00 |" in text
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_block_cost_prices_each_planned_arm_from_the_records(tmp_path: Path, capsys) -> None:
    import json

    tool = _load("block_cost")
    records = tmp_path / "runs"
    measured = {v for _, _, v, _ in tool.PLAN}
    for task in tool.OLD_TASKS:
        (records / task).mkdir(parents=True)
        for variant in measured:
            for seed, wall in enumerate([100.0, 200.0, 300.0]):  # median 200 s a run
                record = {"task": task, "variant": variant, "seed": seed, "wall_seconds": wall}
                (records / task / f"{variant}-s{seed}.json").write_text(json.dumps(record))
    tuning = tmp_path / "tuning.json"
    walls = {"grpo.lr1e-4": {"wall_seconds": {"median": 36.0}}}
    walls["grpo.utd4"] = {"wall_seconds": {"median": 72.0}}
    tuning.write_text(json.dumps({"variants": walls}))
    tool.main(["--records", str(records), "--tuning", str(tuning)])
    out = capsys.readouterr().out
    # each held-out arm: 5 seeds x 8 tasks x 200 s = 8000 s = 2.2 h; 8 arms: 17.8 h
    assert "| main | remix-grpo | 40 | 2.2 |" in out
    # grid: 40 x 36 s = 0.4 h, 40 x 72 s = 0.8 h, placebo 5 x 36 s; probe: 6 x 200 s
    assert (
        "| grid | 8 cells, u4 | 40 | 0.8 |" in out
        and "| probe | baseline, seed 0 | 6 | 0.3 |" in out
    )
    total = 8 * 8000 / 3600 + (40 * 36 + 40 * 72 + 5 * 36 + 6 * 200) / 3600
    assert f"411 runs, {total:.1f} CPU hours" in out


def test_waste_figure_bounds_the_starts_zero_advantage_share(tmp_path: Path, capsys) -> None:
    import json

    tool = _load("waste_figure")
    assert tool.start_bound(0.5, 2) == 0.5  # two coins: equal half the time
    assert tool.start_bound(0.0, 8) == 1.0 and tool.start_bound(0.1, 8) == pytest.approx(
        0.9**8 + 0.1**8
    )
    # Jensen: prompts at 0 and 0.2 (mean 0.1) waste more than the bound at 0.1
    mixed = (tool.start_bound(0.0, 8) + tool.start_bound(0.2, 8)) / 2
    assert mixed >= tool.start_bound(0.1, 8)
    (tmp_path / "t").mkdir()
    for seed, acc in enumerate([0.05, 0.1, 0.3]):
        record = {"evals": [{"eval/accuracy": acc}, {"eval/accuracy": 0.9}]}
        (tmp_path / "t" / f"grpo-s{seed}.json").write_text(json.dumps(record))
    argv = ["--records", str(tmp_path), "--tasks", "t", "u", "--variants", "grpo"]
    assert tool.main([*argv, "--start-bound", "8"]) == 0
    out = capsys.readouterr().out
    assert "| t | 0.100 | 43% |" in out and "| u | - | - |" in out
