"""The suite's evidence table: blocks, placebo, the baseline rule, per-run records, pinned
warm starts; the figures by hand on test_bench's curves."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("scipy")

from replayrl.bench.baseline import choose_baseline, strongest  # noqa: E402
from replayrl.bench.evidence import run_record, task_evidence, write_run_record  # noqa: E402
from replayrl.bench.suite import load_suite, summarise, variant_config  # noqa: E402
from replayrl.config.schema import ConfigError, load_config  # noqa: E402
from test_bench import GAIN_RESULTS, GAIN_SUITE  # noqa: E402


def _with_provenance(machine: str = "m1", commit: str = "c1", sha: str = "w1") -> dict:
    results = copy.deepcopy(GAIN_RESULTS)
    for runs in results.values():
        for s in runs:
            s["provenance"] = {
                "machine_id": machine,
                "cpu_model": "cpu",
                "commit": commit,
                "dirty": False,
                "warmstart_sha256": sha,
            }
            s["num_eval_prompts"] = 500
    return results


def test_evidence_figures_by_hand() -> None:
    ev = task_evidence(_with_provenance(), "grpo")
    # grpo's robust target 0.7475 (test_bench): 3-eval means reach it at 400 and 400, replay's
    # at 150 and 200; replay's resampled medians 150 / 175 / 200 (1/4, 1/2, 1/4) over 400
    replay = ev["variants"]["replay"]
    assert replay["ratio"]["estimate"] == pytest.approx(175 / 400)
    assert replay["ratio"]["low"] == pytest.approx(150 / 400)
    assert replay["ratio"]["high"] == pytest.approx(200 / 400)
    # finals (mean of last 3): replay 0.87, 0.8367; grpo 0.7833, 0.8333: +0.045; the ends
    # are the extreme resamples (each 1/16 > 5%): 0.8367 - 0.8333 and 0.87 - 0.7833
    assert replay["difference"]["estimate"] == pytest.approx(0.045, abs=1e-9)
    assert replay["difference"]["low"] == pytest.approx(0.83667 - 0.83333, abs=1e-4)
    assert replay["difference"]["high"] == pytest.approx(0.87 - 0.78333, abs=1e-4)
    assert replay["claim"] == "2x fewer rollouts; no loss"
    auto = ev["variants"]["replay-auto"]  # trailing means top out at 0.63: never
    assert auto["ratio"]["estimate"] == math.inf and auto["claim"] == "more rollouts; lower final"
    # take-off at 50% of the gain (0.504): both runs; exact interval [0.05^(1/2), 1]
    assert auto["takeoff"]["low"] == pytest.approx(0.05**0.5) and auto["takeoff"]["high"] == 1


def test_table_refuses_runs_from_two_machines_unless_mixed(tmp_path: Path) -> None:
    results = _with_provenance()
    results["replay"][1]["provenance"]["machine_id"] = "m2"
    with pytest.raises(ConfigError, match="more than one machine or commit"):
        summarise(GAIN_SUITE, results, [0, 1], tmp_path, quick=False)
    summarise({**GAIN_SUITE, "mixed": True}, results, [0, 1], tmp_path, quick=False)
    table = (tmp_path / "table.md").read_text()
    assert "| g | replay | 2 | A,B |" in table and "| g | grpo (baseline) | 2 | A |" in table
    assert "- B: cpu (m2), commit c1" in table
    # the median verdicts under the intervals are labelled descriptive, not claims
    assert "is a point comparison, not a claim" in table
    assert table.index("Claims (fixed before the runs)") < table.index("is a point comparison")


def test_table_refuses_two_warm_starts_and_a_dirty_commit_is_its_own_block(
    tmp_path: Path,
) -> None:
    results = _with_provenance()
    results["grpo"][0]["provenance"]["warmstart_sha256"] = "w2"
    with pytest.raises(ConfigError, match="2 different warm starts"):
        summarise(GAIN_SUITE, results, [0, 1], tmp_path, quick=False)
    results = _with_provenance()
    results["grpo"][0]["provenance"]["dirty"] = True
    with pytest.raises(ConfigError, match=r"c1\+dirty"):
        summarise(GAIN_SUITE, results, [0, 1], tmp_path, quick=False)


def test_table_states_the_rule_and_no_internal_goals(tmp_path: Path) -> None:
    summarise(GAIN_SUITE, _with_provenance(), [0, 1], tmp_path, quick=False)
    table = (tmp_path / "table.md").read_text()
    assert 'Claims (fixed before the runs): "k x fewer rollouts" only when' in table
    assert "Holm's step-down over the table's methods" in table
    assert "| g | replay | 2 | A | 0.44x [0.38x, 0.50x] | +0.045 [+0.003, +0.087] |" in table
    assert "target <=" not in table and "not met" not in table


def test_table_counts_each_variants_runs_per_task_and_over_tasks(tmp_path: Path) -> None:
    # a control with fewer seeds in than the baseline (one run on task a, two on b): each row
    # says how many runs it stands on, not the baseline's count
    from replayrl.bench.suite import summarise_tasks

    per_task = {}
    for task, replay_runs in (("a", 1), ("b", 2)):
        results = _with_provenance()
        results["replay"] = results["replay"][:replay_runs]
        (tmp_path / task).mkdir()
        per_task[task] = summarise(GAIN_SUITE, results, [0, 1], tmp_path / task, quick=False)
    summarise_tasks(GAIN_SUITE, per_task, [0, 1], tmp_path, quick=False)
    table = (tmp_path / "table.md").read_text()
    assert "| a | replay | 1 | A |" in table and "| b | replay | 2 | A |" in table
    assert "| a | grpo (baseline) | 2 | A |" in table
    assert "| **over 2 tasks** | replay | 3 | |" in table
    assert "| **over 2 tasks** | replay-auto | 4 | |" in table


def _suite_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        "baseline: a\n" + extra + "variants:\n"
        "  a: {config: grpo}\n  b: {config: grpo, overrides: [train.lr=2.0e-4]}\n"
        "  c: {config: grpo, overrides: [train.lr=3.0e-4]}\n"
    )
    return path


def test_placebo_is_the_baseline_on_other_sampling_seeds(tmp_path: Path) -> None:
    suite = load_suite(str(_suite_file(tmp_path, "placebo: true\n")))
    assert list(suite["variants"])[-1] == "placebo"
    cfg = variant_config(suite, "placebo", 2, tmp_path)
    base = variant_config(suite, "a", 2, tmp_path)
    assert cfg.train.seed == 1002 and base.train.seed == 2
    assert cfg.logging.name == "placebo-s2"
    assert cfg.train.lr == base.train.lr and cfg.train.steps == base.train.steps
    bad = tmp_path / "bad.yaml"
    bad.write_text("placebo: true\nvariants:\n  a: {config: grpo}\n  placebo: {config: grpo}\n")
    with pytest.raises(ConfigError, match="rename yours"):
        load_suite(str(bad))


def _tuning_row(final: float, rollouts: float) -> dict:
    return {"robust": {"final_mean": {"median": final}, "to_gain": {"0.9": {"rollouts": {
        "median": rollouts}}}}}  # fmt: skip


def test_strongest_setting_rule() -> None:
    rows = {"g.x": _tuning_row(0.95, 2000), "g.y": _tuning_row(0.945, 1500), "g.z": _tuning_row(
        0.99, 2500)}  # fmt: skip
    assert strongest(rows, ["g.x", "g.y", "g.z"]) == "g.z"  # 0.04 above the others
    rows["g.x"] = _tuning_row(0.985, 1000)  # within 0.01 of the best and faster
    assert strongest(rows, ["g.x", "g.y", "g.z"]) == "g.x"
    with pytest.raises(ConfigError, match="no"):
        strongest(rows, ["g.x", "g.missing"])
    # the guard: a setting 0.016 below the best final but twice as fast is rejected at the
    # default 0.01 and picked at the no-loss margin's 0.02; 0.031 below stays out at 0.02
    rows = {"g.x": _tuning_row(0.98, 2000), "g.y": _tuning_row(0.964, 1000), "g.z": _tuning_row(
        0.949, 500)}  # fmt: skip
    assert strongest(rows, ["g.x", "g.y", "g.z"]) == "g.x"
    assert strongest(rows, ["g.x", "g.y", "g.z"], guard=0.02) == "g.y"


def test_baseline_choice_reads_tuning_results_and_refuses_a_stale_baseline(
    tmp_path: Path,
) -> None:
    tuning = tmp_path / "tuning.json"
    rows = {"t.1": _tuning_row(0.9, 1000), "t.2": _tuning_row(0.99, 3000), "t.3": _tuning_row(
        0.95, 500)}  # fmt: skip
    tuning.write_text(json.dumps({"variants": rows}))
    choice = (
        f"baseline_choice:\n  tuning_results: {tuning}\n  settings: {{t.1: a, t.2: b, t.3: c}}\n"
    )
    with pytest.raises(ConfigError, match="disagrees with the rule"):
        load_suite(str(_suite_file(tmp_path, choice)))
    path = _suite_file(tmp_path, choice + "placebo: true\n")
    path.write_text(path.read_text().replace("baseline: a", "baseline: b"))
    suite = load_suite(str(path))
    assert suite["baseline"] == "b" and "strongest of 3" in suite["baseline_rule"]
    assert suite["variants"]["placebo"]["overrides"] == ["train.lr=2.0e-4"]  # b's
    # the shipped held-out suite: the committed tuning results pick the GRPO preset
    assert load_suite("heldout")["baseline"] == "grpo-p16"
    suite = {"baseline": "a", "path": str(path), "variants": {"a": {}}}
    suite["baseline_choice"] = {"settings": {"t.1": "a"}}
    with pytest.raises(ConfigError, match="at least 3"):
        choose_baseline(suite)


def test_run_record_is_small_and_keeps_curve_and_provenance(tmp_path: Path) -> None:
    s = _with_provenance()["replay"][0]
    s["model_path"] = s["provenance"]["warmstart_path"] = "/home/someone/.cache/x"
    s["generation_seconds"], s["training_seconds"] = 41.5, 64.0
    path = write_run_record(tmp_path, run_record(s, "sub6", "replay", 3))
    assert path == tmp_path / "sub6" / "replay-s3.json"
    rec = json.loads(path.read_text())
    assert rec["provenance"]["machine_id"] == "m1" and rec["seed"] == 3
    assert [e["eval/accuracy"] for e in rec["evals"]] == [0.2, 0.6, 0.85, 0.88, 0.88]
    assert rec["evals"][2]["rollouts_generated"] == 100
    # where a step's time went, for speed tables read back from records
    assert (rec["generation_seconds"], rec["training_seconds"]) == (41.5, 64.0)
    assert "/home/someone" not in path.read_text()  # no local paths in a committed record
    assert "unmatched_settings" not in rec  # only a peer trainer's record has one
    peer = {**s, "peer": "trl", "trl_version": "1.16", "unmatched_settings": ["lr schedule"]}
    rec = run_record(peer, "sub6", "trl-grpo", 3)
    assert (rec["peer"], rec["unmatched_settings"]) == ("trl", ["lr schedule"])


def test_pinned_warmstart_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replayrl.run.records.provenance import weights_sha256
    from replayrl.run.warmstart import pinned_warmstart
    from test_provenance import TINY_WARMSTART as tiny

    cfg = load_config("grpo", tiny)
    pin = tmp_path / "pinned" / "task"
    monkeypatch.setenv("REPLAYRL_CACHE", str(tmp_path / "cache1"))
    built = pinned_warmstart(cfg.model, cfg.task, pin, export=True, log=lambda _: None)
    assert (pin / "warmstart.json").is_file() and built["sha256"] == weights_sha256(pin)
    assert not [f for f in pin.iterdir() if f.suffix in {".bin", ".pt", ".pkl"}]
    # another machine: an empty cache gets exactly the pinned weights
    monkeypatch.setenv("REPLAYRL_CACHE", str(tmp_path / "cache2"))
    loaded = pinned_warmstart(cfg.model, cfg.task, pin, log=lambda _: None)
    assert loaded == built
    cached = tmp_path / "cache2" / "warmstart" / built["key"]
    assert weights_sha256(cached) == built["sha256"]
    # another config's pin, or tampered weights: refused
    other = load_config("grpo", [*tiny, "model.warmstart.steps=3"])
    with pytest.raises(ValueError, match="another config"):
        pinned_warmstart(other.model, other.task, pin, log=lambda _: None)
    weights = next(pin.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="do not match"):
        pinned_warmstart(cfg.model, cfg.task, pin, log=lambda _: None)


def test_heldout_suite_evaluates_500_prompts_on_every_task(tmp_path: Path) -> None:
    from replayrl.bench.evidence import MIN_EVAL_PROMPTS
    from replayrl.rollout.evaluation import held_out_rows
    from replayrl.rollout.tasks import task_from_config

    suite = load_suite("heldout")
    for task in suite["tasks"]:
        cfg = variant_config(suite, suite["baseline"], 0, tmp_path, task=task)
        # eval.num_prompts alone is capped by the task's eval split (200 by default)
        assert len(held_out_rows(cfg, task_from_config(cfg.task))) >= MIN_EVAL_PROMPTS, task


def test_a_run_without_evaluations_is_named_in_the_error() -> None:
    results = _with_provenance()
    results["replay"][1]["evals"] = []
    with pytest.raises(ValueError, match="replay against grpo: run 1 has no evaluations"):
        task_evidence(results, "grpo")


def test_records_table_gives_the_suites_figures_from_committed_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # benchmarks/records_table.py: arms that ran outside a suite (a peer trainer), read back
    # from their records in two folders, get the rows the suite itself draws from the same
    # runs: per task (different runs on each task) and over the tasks
    import importlib.util

    from replayrl.bench.suite import summarise_tasks

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("rt", root / "benchmarks/records_table.py")
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def per_task(results: dict) -> dict:
        # task a: replay's runs; task b: slower runs under the same name
        return {
            "a": {"grpo": results["grpo"], "replay": results["replay"]},
            "b": {"grpo": results["grpo"][::-1], "replay": results["replay-auto"]},
        }

    def write(results: dict) -> None:
        folders = {"grpo": "ours", "replay": "peer"}
        for task, arms in per_task(results).items():
            for variant, runs in arms.items():
                for seed, s in enumerate(runs):
                    record = run_record(s, task, variant, seed)
                    write_run_record(tmp_path / folders[variant], record)

    results = _with_provenance()
    write(results)
    suite = {**GAIN_SUITE, "variants": {"grpo": {}, "replay": {}}}
    summaries = {}
    for task, arms in per_task(copy.deepcopy(results)).items():
        (tmp_path / "suite" / task).mkdir(parents=True)
        summaries[task] = summarise(suite, arms, [0, 1], tmp_path / "suite" / task, quick=False)
    summarise_tasks(suite, summaries, [0, 1], tmp_path / "suite", quick=False)
    suite_rows = [
        line
        for line in (tmp_path / "suite" / "table.md").read_text().splitlines()
        # the evidence table's rows (9 columns), not the descriptive table under it
        if line.startswith(("| a |", "| b |", "| **over 2 tasks** |")) and line.count("|") == 11
    ]
    assert len(suite_rows) == 5

    # the baseline is the second arm given: it is found by name, not by place
    arms = ["--arms", f"{tmp_path / 'peer'}:replay", f"{tmp_path / 'ours'}:grpo"]
    argv = ["--baseline", "grpo", "--tasks", "a", "b", "--seeds", "0", "1", *arms]
    assert tool.main(argv) == 0
    table = capsys.readouterr().out
    for row in suite_rows:
        assert row in table
    assert "| a | replay | 2 | A | 0.44x [0.38x, 0.50x] | +0.045 [+0.003, +0.087] |" in table
    assert "| b | replay | 2 | A | 0.44x" not in table  # b's own runs, not a's

    def refused(argv: list[str]) -> str:
        assert tool.main(argv) == 2
        return capsys.readouterr().err

    # a missing record is named, not a smaller table
    assert "replay-s2.json: missing" in refused(
        ["--baseline", "grpo", "--tasks", "a", "--seeds", "0", "1", "2", *arms]
    )
    # a seed or an arm given twice would count the same runs twice
    assert "seed given more than once: 1" in refused(
        ["--baseline", "grpo", "--tasks", "a", "--seeds", "0", "1", "1", *arms]
    )
    assert "variant given more than once: grpo" in refused(
        ["--baseline", "grpo", "--tasks", "a", "--seeds", "0", *arms, f"{tmp_path / 'peer'}:grpo"]
    )
    # an unreadable record is named too, not a crash
    broken = tmp_path / "ours" / "a" / "grpo-s1.json"
    saved = broken.read_text()
    broken.write_text("{not json")
    assert "grpo-s1.json: not a JSON record" in refused(argv)
    broken.write_text("[1, 2]")
    assert "grpo-s1.json: not a JSON record (a list)" in refused(argv)
    broken.write_text(saved)
    # a record under another run's name
    moved = tmp_path / "peer" / "a" / "replay-s1.json"
    moved.write_text((tmp_path / "peer" / "a" / "replay-s0.json").read_text())
    assert "replay-s1.json: the record is task, variant, seed ('a', 'replay', 0)" in refused(argv)
    # runs from two machines are refused, as in the suite
    results["replay"][1]["provenance"]["machine_id"] = "m2"
    write(results)
    assert "more than one machine or commit" in refused(argv)
    with pytest.raises(SystemExit):
        tool.main([*argv[:-1]])  # the baseline is no arm


def test_run_record_keeps_per_step_metrics_in_spans(tmp_path: Path) -> None:
    from replayrl.bench.evidence import STEP_BINS, step_metrics

    rows = [
        {
            "step": i,
            "rollouts_generated": 64 * i,
            "tokens_generated": 1000 * i,
            "tokens_trained": 2000 * i,
            "wall_seconds": 1.5 * i,
            "signal/frac_reward_zero_std": 0.5 if i % 2 else 1.0,
            "batch/age_mean": 0.25,
            "train/ess": 0.99,
            "train/on_policy/tokens": 300,
            "train/off_policy/tokens": 100 if i > 50 else 0,
            "time/generation_s": 0.5,
            "time/training_s": 1.0,
        }
        for i in range(1, 129)
    ]
    cols = step_metrics(rows)
    assert len(cols["step"]) == STEP_BINS and sum(cols["steps"]) == 128
    assert cols["step"][0] == 4 and cols["step"][-1] == 128  # each span's last step
    assert cols["rollouts_generated"][-1] == 64 * 128  # counters: the span's end
    assert cols["zero_advantage"] == [0.75] * STEP_BINS  # shares: the span's mean
    assert cols["replayed"][0] == 0.0 and cols["replayed"][-1] == 0.25
    assert cols["generation_s"] == [2.0] * STEP_BINS and cols["training_s"][0] == 4.0
    assert cols["staleness"][0] == 0.25 and cols["ess"][0] == 0.99
    # a run without a metric (an on-policy run logs no off-policy tokens) has no column
    bare = step_metrics([{"step": 1, "rollouts_generated": 8}, {"step": 2}])
    assert bare["steps"] == [1, 1] and "replayed" not in bare and "ess" not in bare

    summary = {"evals": [{"step": 0, "rollouts_generated": 0, "eval/accuracy": 0.1}]}
    path = write_run_record(tmp_path, run_record(summary, "t", "grpo", 0, metrics=rows))
    record = json.loads(path.read_text())
    assert record["step_metrics"] == json.loads(json.dumps(cols))
    assert path.stat().st_size < 12_000  # small enough to commit beside the table
    assert "step_metrics" not in run_record(summary, "t", "grpo", 0)  # no metrics: none


def test_the_suite_writes_each_runs_per_step_metrics_into_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import replayrl.bench.suite as bench
    from test_bench import _stand_in_run

    def run_with_metrics(cfg, peer, run_dir: Path, log) -> dict:
        summary = _stand_in_run(cfg, peer, run_dir, log)
        rows = [
            {"step": 1, "rollouts_generated": 32, "signal/frac_reward_zero_std": 0.75},
            {"step": 2, "rollouts_generated": 64, "signal/frac_reward_zero_std": 0.25},
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return summary

    monkeypatch.setattr(bench, "run_one", run_with_metrics)
    suite = {**load_suite("reasoning"), "results_dir": str(tmp_path / "records")}
    bench.run_suite(suite, [0], tmp_path / "out", quick=True, only=["grpo"])
    record = json.loads((tmp_path / "records" / "add" / "grpo-s0.json").read_text())
    assert record["step_metrics"]["zero_advantage"] == [0.75, 0.25]
    assert record["step_metrics"]["rollouts_generated"] == [32, 64]


def test_the_next_block_is_set_up_as_the_rule_says(tmp_path: Path) -> None:
    from replayrl.bench.suite import fairness_problems, planned_runs

    grid = load_suite("grpo-grid")
    cells = {n: variant_config(grid, n, 0, tmp_path, False, None) for n in grid["variants"]}
    cells.pop("placebo")
    shapes = {(c.train.lr, c.rollout.prompts_per_step, c.train.epochs) for c in cells.values()}
    assert len(cells) == len(shapes) == 16  # lr x batch shape x updates per batch, no repeats
    assert {c.train.lr for c in cells.values()} == {3e-5, 5e-5, 1e-4, 2e-4}  # below 1e-4 too
    assert {c.rollout.prompts_per_step for c in cells.values()} == {8, 16}
    assert {c.train.rollout_budget or c.train.steps * c.rollout.prompts_per_step * 8
            for c in cells.values()} == {10_240}  # fmt: skip
    held = load_suite("heldout8")
    # the baseline is chosen among every grid cell, with the no-loss margin as the guard
    choice = held["baseline_choice"]
    assert set(choice["settings"]) == set(cells) and choice["guard"] == 0.02
    assert held["baseline"] in choice["settings"].values()
    assert "within 0.02 of the best" in held["baseline_rule"]
    # four tasks of the block and six candidates over three operations
    ops = {
        t: variant_config(held, "remix-grpo", 0, tmp_path, False, t).task.reasoning.op
        for t in held["tasks"]
    }
    assert list(ops)[:4] == ["add6", "sub6", "sub5m2", "add5m2h"] and len(ops) == 14
    # ... the first four exactly as the 2026-12-04 block ran them (suite `heldout`)
    old = load_suite("heldout")
    for task in list(ops)[:4]:
        assert held["tasks"][task] == old["tasks"][task], task
    assert held["overrides"] == old["overrides"]
    assert set(list(ops.values())[4:]) == {"add", "sub", "chain"}
    # the no-reuse control: ReMix's shape and lr, 4 updates a step, no rollout seen twice
    fresh = variant_config(held, "grpo-fresh-updates", 0, tmp_path, False, "add6")
    assert (fresh.rollout.prompts_per_step, fresh.train.lr, fresh.train.epochs) == (8, 5e-5, 1)
    assert 64 // fresh.train.mini_batch_size == 4
    only = [held["baseline"], "placebo", "remix-grpo", "replay-posbias", "grpo-fresh-updates"]
    plan = planned_runs(held, [0], tmp_path, only=[*only, "ar3po", "dapo", "repo"])
    assert fairness_problems(held, plan) == []
