"""The findings helpers on synthetic metrics, values computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.bench.paper_findings import (
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


def _fake_run(
    d: Path, steps: int, per_step: int, length, entropy: float, ess=None, **summary
) -> None:
    """A finished run folder: per-step rows with `length(step)`, a constant entropy and
    stale tokens' ESS / N (`ess`; None as runs without stale tokens log it; the batch lag
    alternates 0, 2), an eval row every 4 steps (accuracy rising by 0.01 a step), and a
    summary.json."""
    d.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.2}]
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "completion_length": length(s),
                "train/entropy": entropy,
                "rollouts_generated": s * per_step,
                "train/off_policy/ess": ess,
                "train/on_policy/ess": 1.0,
                "batch/age_mean": float(2 * (s % 2)),
                "batch/age_max": float(2 * (s % 2)),
            }
        )
        if s % 4 == 0:
            rows.append({"step": s, "eval/accuracy": 0.2 + 0.01 * s})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"steps": steps, **summary}))


def _script():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "findings.py"
    spec = importlib.util.spec_from_file_location("findings_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_findings_script_tables(tmp_path: Path) -> None:
    script = _script()
    root = tmp_path / "runs"
    _fake_run(root / "add" / "grpo-s0", 80, 128, lambda s: 40.0, 0.02, final_eval_accuracy=0.9)
    _fake_run(root / "add" / "replay-s0", 120, 64, lambda s: 38.0, 0.03, ess=0.8)
    _fake_run(
        root / "add" / "remix-grpo-s0",
        120,
        64,
        lambda s: 36.0 if s <= 50 else 44.0,
        0.02,
        reincarnation_step=50,
    )
    (root / "add" / "replay-s1").mkdir()  # unfinished: no summary.json, left out
    out = tmp_path / "out"
    assert script.main([str(root), str(out), "--tasks", "add"]) == 0
    md = (out / "findings.md").read_text()
    assert "- add: grpo [0], remix-grpo [0], replay [0]" in md
    # the commands block quotes this report's own command, and no buffer runs it did not read
    assert f"benchmarks/findings.py {root} {out} --tasks add\n" in md
    assert "buffer_sizes.py" not in md
    # lengths: 38 vs GRPO's 40 in both windows
    # ESS / N stale 0.8, fresh 1.0, lag mean and max 1.0 (0, 2, 0, 2 ...), no KL terms
    assert (
        "| add | replay | [0] | 38.0 (-2.0) | 38.0 (-2.0) | one seed | 0.800 | 1.000 | 1.00 | "
        "1.00 | n/a | n/a |" in md
    )
    # remix over steps 1-80: 50 steps of 36 and 30 of 44 -> 39.0; rollouts 2,561-7,680 are
    # steps 41-120: 10 of 36 and 70 of 44 -> 43.0
    assert "| add | remix-grpo | [0] | 39.0 (-1.0) | 43.0 (+3.0) | one seed | n/a | 1.000 |" in md
    assert "| add | remix-grpo | [0] | 36.0 | 44.0 | 44.0 | +8.0 |" in md
    assert "| add | grpo | [0] | 40.0 | 40.0 | 40.0 | +0.0 |" in md
    assert "shorter than GRPO at equal data: 1 of 2" in md
    assert "| add | replay | [0] | 0.0300 (x1.50) | 0.0300 (x1.50) | one seed |" in md
    assert "higher entropy than GRPO at equal data: 1 of 1" in md
    assert "Not evaluated (run with `--passk`)" in md
    assert "Fewer than two capacities finished" in md
    assert (out / "length_vs_step.png").stat().st_size > 0
    assert (out / "entropy_vs_step.png").stat().st_size > 0


def test_findings_script_buffer_table(tmp_path: Path) -> None:
    script = _script()
    root, buf = tmp_path / "runs", tmp_path / "buffers"
    _fake_run(root / "add" / "grpo-s0", 80, 128, lambda s: 40.0, 0.02, final_eval_accuracy=0.9)
    _fake_run(root / "add" / "replay-s0", 120, 64, lambda s: 38.0, 0.03)
    _fake_run(buf / "add" / "replay-cap512-s0", 120, 64, lambda s: 38.0, 0.03)
    out = tmp_path / "out"
    assert script.main([str(root), str(out), "--tasks", "add", "--buffers", str(buf)]) == 0
    md = (out / "findings.md").read_text()
    # accuracy 0.2 + 0.01 s, evaluated every 4 steps of 64 rollouts: 0.9 first at step 72
    # (4,608 rollouts), 0.95 at step 76 (4,864); every change between evals is 0.04
    for n, x in (("256 (suite run)", 4), ("512", 8)):
        assert f"| {n} | 0 | {x} | 4608 | 4864 | 1.400 | 1.400 | 0.040 | 0.040 |" in md
    assert (out / "buffer_capacity.png").stat().st_size > 0


def test_findings_script_passk_table_from_cache(tmp_path: Path) -> None:
    script = _script()
    root = tmp_path / "runs"
    for seed in (0, 1):  # lengths 40 and 42: median 41, range 40-42
        _fake_run(root / "add" / f"grpo-s{seed}", 80, 128, lambda s, k=seed: 40.0 + 2 * k, 0.02)
    _fake_run(root / "add" / "replay-s0", 120, 64, lambda s: 38.0, 0.03)
    out = tmp_path / "out"
    out.mkdir()

    def entry(p1: float, p8: float) -> dict:
        return {"model": "m", "pass@1": p1, "pass@8": p8, "greedy_length": 40.0}

    cache = {
        "add/warm-start": entry(0.25, 0.5),
        "add/grpo-s0": entry(0.8, 0.9),
        "add/grpo-s1": entry(0.6, 0.8),  # median over the two seeds: 0.7, 0.85
        "add/replay-s0": entry(0.65, 0.95),
    }
    (out / "passk.json").write_text(json.dumps(cache))
    assert script.main([str(root), str(out), "--tasks", "add"]) == 0
    md = (out / "findings.md").read_text()
    assert "| add | grpo | [0, 1] | 41.0 | 41.0 | 40.0-42.0 | n/a |" in md
    assert "| add | replay | [0] | 38.0 (-3.0) | 38.0 (-3.0) | one seed | n/a |" in md
    assert "| add | warm start | [] | 0.250 | 0.500 | 0.000 | 0.000 | n/a | n/a | 40.0 |" in md
    assert "| add | grpo | [0, 1] | 0.700 | 0.850 | 0.450 | 0.350 | n/a | n/a | 40.0 |" in md
    assert "| add | replay | [0] | 0.650 | 0.950 | 0.400 | 0.450 | -0.050 | 0.100 | 40.0 |" in md
    assert "larger than their pass@1 edge: 1 of 1 (task, variant) pairs" in md
    assert (out / "passk.png").stat().st_size > 0


def test_passk_jobs_warm_start_first_and_ids_without_paths(tmp_path: Path) -> None:
    script = _script()
    root = tmp_path / "runs"
    for task in ("add", "sub"):
        _fake_run(
            root / task / "grpo-s0",
            80,
            128,
            lambda s: 40.0,
            0.02,
            model_path=str(tmp_path / "cache" / f"warm-{task}"),
            wall_seconds=12.34,
        )
    pol = root / "add" / "grpo-s0" / "checkpoints" / "step_000080" / "policy"
    pol.mkdir(parents=True)
    (pol / "config.json").write_text("{}")  # sub's run has no checkpoint: no job for it
    jobs = script.passk_jobs(script.load_runs(root, ["add", "sub"]))
    assert [(k, ident) for k, _, _, ident in jobs] == [
        ("add/warm-start", "warmstart/warm-add"),
        ("add/grpo-s0", "grpo-s0/step_000080@12.3"),
        ("sub/warm-start", "warmstart/warm-sub"),
    ]
    assert jobs[1][2] == str(pol)


def test_findings_script_evaluates_a_saved_policy(
    tmp_path: Path, tiny_model, char_tokenizer
) -> None:
    """`--passk` loads a run's saved policy the way `replayrl eval` does and scores it: the
    script's imports and calls must follow the library (a moved function broke it once)."""
    from replayrl.config.schema import config_to_yaml, load_config
    from replayrl.storage.checkpoint import save_checkpoint

    script = _script()
    ckpt = save_checkpoint(tmp_path, 1, tiny_model, char_tokenizer, {}, keep_last=1)
    cfg = load_config(
        None,
        [
            "eval.num_prompts=6",
            "eval.batch_size=6",
            "task.eval_size=6",
            "rollout.max_new_tokens=4",
            "model.tiny.num_layers=1",
        ],
    )
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    res = script.evaluate_model(tmp_path / "config.yaml", str(ckpt / "policy"))
    assert res["num_prompts"] == 6
    assert 0.0 <= res["pass@1"] <= 1.0 and 0.0 <= res[f"pass@{script.PASS_K}"] <= 1.0
    assert 0 <= res["greedy_length"] <= 4 + 1  # at most max_new_tokens (+ EOS)
