"""The discrete-event model of the asynchronous system (`replayrl simulate`)."""

from __future__ import annotations

import json

import pytest
import yaml

from replayrl.cli.main import main
from replayrl.cli.simulate import measured, spec_from_run
from replayrl.design.event_model import SystemSpec, simulate
from replayrl.design.theory import gamma


def test_on_policy_timeline_matches_the_hand_computed_one():
    """W=1, T=1, on-policy queue, R=B=4, g=1 s, l=0.5 s, no spread.

    t=0-4 batch 0 (v0); the learner reads it at t=4 and trains until 6 (age 0). The generator
    starts batch 1 at t=4 still holding v0 (v1 is published at 6): delivered at 8, trained
    8-10 at v1 (age 1). Batch 2 starts at 8 with v1, trained 12-14 at v2 (age 1). Three steps
    end at t=14; the generator was busy the whole time (batch 3 runs 12-16)."""
    spec = SystemSpec(1, 1, 4, 4, gen_seconds=1.0, learn_seconds=0.5, steps=3)
    r = simulate(spec)
    assert r.wall_seconds == pytest.approx(14.0)
    assert r.ages == [0] * 4 + [1] * 8
    assert r.step_ages == [0.0, 1.0, 1.0]
    assert r.trained == 12 and r.generated == 12
    assert r.learner_idle_share == pytest.approx(1 - 6 / 14)
    assert r.generator_idle_share == pytest.approx(0.0)
    assert r.effective_y == pytest.approx(1.0)
    # gamma: (W + T) x wall / trained / (g + l) = 2 x 14 / 12 / 1.5
    assert r.gamma == pytest.approx(28 / 12 / 1.5)


def test_measured_gamma_meets_the_papers_when_both_roles_stay_busy():
    """W/T = mu / y keeps generation and training in step: then gamma = (1 + W/T)/(1 + mu)."""
    spec = SystemSpec(
        generators=4,
        learners=1,
        rollouts_per_batch=16,
        batch_size=128,
        capacity=512,
        gen_seconds=0.04,
        learn_seconds=0.01,  # mu = 4, y = mu T / W = 1
        replay_ratio=1.0,
        steps=300,
    )
    r = simulate(spec)
    assert r.learner_idle_share < 0.1
    assert r.gamma == pytest.approx(gamma(4.0, 4, 1), rel=0.1)
    assert r.effective_y == pytest.approx(1.0, abs=0.05)


def test_replay_pace_caps_uses_per_generated_rollout():
    spec = SystemSpec(
        1, 1, 64, 128, gen_seconds=0.01, learn_seconds=0.001, capacity=256, replay_ratio=2.0
    )
    r = simulate(spec)
    # the learner is 10x faster than the generator, so only the pace stops it
    assert r.trained <= 2.0 * r.generated
    assert r.effective_y == pytest.approx(2.0, rel=0.05)
    assert r.learner_idle_share > 0.5


def test_staleness_bound_drops_old_rollouts_and_no_trained_one_exceeds_it():
    spec = SystemSpec(
        generators=6,
        learners=1,
        rollouts_per_batch=64,
        batch_size=64,
        capacity=1024,
        gen_seconds=0.01,
        learn_seconds=0.002,
        max_staleness=1,
        steps=100,
    )
    r = simulate(spec)
    assert max(r.ages) <= 1
    assert r.dropped_stale > 0
    unbounded = simulate(SystemSpec(**{**spec.__dict__, "max_staleness": None}))
    assert max(unbounded.ages) > 1  # the bound did something


def test_more_sync_latency_means_more_generator_idle_and_older_rollouts():
    base = dict(
        generators=2,
        learners=1,
        rollouts_per_batch=32,
        batch_size=64,
        gen_seconds=0.02,
        learn_seconds=0.01,
        steps=100,
    )
    fast = simulate(SystemSpec(**base, sync_seconds=0.0))
    slow = simulate(SystemSpec(**base, sync_seconds=2.0))
    assert slow.seconds_per_step > fast.seconds_per_step
    assert slow.trained_per_second < fast.trained_per_second
    assert fast.generator_sync_share == 0.0
    # weight loads are their own share, not counted as generating or as idle
    assert 0.1 < slow.generator_sync_share < 1.0
    assert slow.generator_idle_share + slow.generator_sync_share <= 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": 8}, "capacity N=8 is below the batch B=16"),
        ({"generators": 0}, "generators must be at least 1"),
        ({"gen_seconds": 0.0}, "gen_seconds must be a finite number > 0"),
        ({"gen_spread": float("nan")}, "gen_spread must be a finite number >= 0"),
        ({"sync_seconds": float("inf")}, "sync_seconds must be a finite number >= 0"),
        ({"max_pending_batches": 0}, "max_pending_batches must be at least 1"),
        ({"replay_ratio": -1.0}, "replay_ratio must be positive"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(kwargs, message):
    args = dict(
        generators=1,
        learners=1,
        rollouts_per_batch=16,
        batch_size=16,
        gen_seconds=1.0,
        learn_seconds=1.0,
    )
    with pytest.raises(ValueError, match=message):
        SystemSpec(**{**args, **kwargs})


def _fake_run(path, steps=10):
    """A finished async-local run folder as the runtime writes it (config, summary, metrics)."""
    path.mkdir()
    cfg = {
        "workers": {
            "generators": 2,
            "learners": 1,
            "sync_every": 1,
            "max_staleness": None,
            "on_stale": "drop",
            "replay_ratio": "auto",
            "max_pending_batches": 4,
        },
        "buffer": {"kind": "replay", "capacity": 256},
        "rollout": {"prompts_per_step": 8, "num_generations": 8},
        "train": {"batch_size": 128},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    roles = {
        "generator/0": {"busy_s": 3.0, "idle_s": 1.0, "rollouts": 640},
        "generator/1": {"busy_s": 3.0, "idle_s": 1.0, "rollouts": 640},
        "learner/0": {"busy_s": 5.12, "idle_s": 0.5, "rollouts": 1280},
    }
    summary = {"steps": steps, "wall_seconds": 6.0, "accounting": {"roles": roles}}
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": 0, "eval/accuracy": 0.3}]
    rows += [
        {"step": i, "batch/age_mean": float(i % 3), "time/training_s": 0.5 + 0.02 * (i % 2)}
        for i in range(1, steps + 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_spec_from_run_reads_the_runs_roles_sizes_and_costs(tmp_path):
    run = _fake_run(tmp_path / "run")
    spec = spec_from_run(run)
    assert (spec.generators, spec.learners) == (2, 1)
    assert (spec.rollouts_per_batch, spec.batch_size, spec.capacity) == (64, 128, 256)
    assert spec.replay_ratio == pytest.approx(2.0)  # auto = B / R
    assert spec.gen_seconds == pytest.approx(6.0 / 1280)
    assert spec.learn_seconds == pytest.approx(5.12 / 1280)
    assert spec.step_overhead_seconds == pytest.approx((6.0 - 5.12 - 0.5) / 10)
    assert spec.steps == 10
    m = measured(run)
    assert m["seconds_per_step"] == pytest.approx(0.6)
    assert m["step_age_p50"] == pytest.approx(1.0)


def test_cli_compares_a_run_with_the_model(tmp_path, capsys):
    run = _fake_run(tmp_path / "run")
    assert main(["simulate", "--from-run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "model vs run" in out and "seconds_per_step" in out and "gamma: measured" in out


def test_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["simulate", "--from-run", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_cli_json_summary_has_every_output(capsys):
    args = ["simulate", "--mu", "5.3", "--learn-seconds", "0.01", "--generators", "3"]
    assert main([*args, "--batch", "64", "--capacity", "128", "--replay-ratio", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in (
        "trained_per_second",
        "generated_per_second",
        "generator_idle_share",
        "learner_idle_share",
        "age",
        "gamma",
        "gamma_paper",
        "effective_x",
        "effective_y",
    ):
        assert key in d
    assert d["gamma_paper"] == pytest.approx(gamma(5.3, 3, 1))


def test_cluster_table_has_a_row_per_setting(capsys):
    args = ["simulate", "--cluster-table", "--gpus", "8", "16", "--mus", "5.3"]
    assert main([*args, "--syncs", "1", "10", "--steps", "20"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 2 * 2  # header + GPUs x syncs


def test_a_system_that_can_never_serve_a_batch_is_an_error_not_a_hang():
    # weights every 2 steps, yet rollouts must be of the learner's own version: at version 1
    # every delivery (still version 0) is dropped, forever
    spec = SystemSpec(
        1, 1, 16, 16, gen_seconds=0.01, learn_seconds=0.01, max_staleness=0, sync_every=2
    )
    with pytest.raises(ValueError, match="took no step"):
        simulate(spec)


def test_cli_epochs_lengthen_each_learner_step_by_hand(capsys):
    """`replayrl simulate --epochs 2`, W=1, T=1, on-policy, R=B=4, g=1 s, l=0.25 s per
    rollout and pass, no spread: a step trains 4 x 2 x 0.25 = 2 s, the hand-computed
    timeline of l=0.5 s at one pass. t=0-4 batch 0 (v0), trained 4-6 (age 0); batch 1 runs
    4-8 on v0, trained 8-10 at v1 (age 1); batch 2 runs 8-12 on v1, trained 12-14 at v2 (age
    1). Three steps end at t=14, the learner busy 6 s of them. Without the passes a step
    would take 1 s and the run end at t=13."""
    args = ["simulate", "--generators", "1", "--learners", "1", "--rollouts-per-batch", "4"]
    args += ["--batch", "4", "--gen-seconds", "1", "--learn-seconds", "0.25", "--epochs", "2"]
    assert main([*args, "--gen-spread", "0", "--learn-spread", "0", "--steps", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["spec"]["epochs"] == 2
    assert d["seconds_per_step"] == pytest.approx(14 / 3)
    assert d["learner_idle_share"] == pytest.approx(1 - 6 / 14)
    assert d["trained_per_second"] == pytest.approx(12 / 14)
    assert d["age_mean"] == pytest.approx(8 / 12)  # ages 0 x 4, then 1 x 8


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--gen-spread", "nan"], "--gen-spread must be a finite number >= 0, got nan"),
        (["--sync-seconds", "inf"], "--sync-seconds must be a finite number >= 0, got inf"),
        (["--max-pending-batches", "0"], "--max-pending-batches must be a whole number >= 1"),
        (["--mu", "0"], "--mu must be a finite number > 0, got 0.0"),
        (["--steps", "0"], "--steps must be a whole number >= 1, got 0"),
        (["--learn-seconds", "-1"], "--learn-seconds must be a finite number > 0"),
        (["--replay-ratio", "nan"], "--replay-ratio must be a finite number > 0"),
        (["--cluster-table", "--syncs", "1", "inf"], "--syncs must be a finite number >= 0"),
        (["--cluster-table", "--gpus", "1"], "--gpus must each be 2 or more"),
    ],
)
def test_cli_refuses_numbers_the_model_cannot_run_naming_the_flag(flags, message, capsys):
    # a NaN once ran and printed "simulated 200 steps in nan s"; 0 pending batches ended in
    # SimPy's traceback; --steps 0 silently ran 200 steps; --mu 0 named gen_seconds
    code = main(["simulate", "--mu", "5", *flags])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_cli_runs_exactly_the_steps_asked(capsys):
    assert main(["simulate", "--mu", "5", "--steps", "3"]) == 0
    assert "simulated 3 steps in " in capsys.readouterr().out
