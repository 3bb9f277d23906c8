"""Fault injection, part 3, through the CLI: rewards that say nothing, runs that train nothing,
storage errors while checkpointing, prompts too long to evaluate, a second signal.

Catalogue (each test names its case ids):
  N1 every reward function returns None for some completions: skipped and counted (summary,
     ledger, metrics), one warning, the rest trains
  N2 ... for every completion, train.failure_patience steps in a row: the run ends naming it
  T1 a run shorter than train.failure_patience whose every rollout was dropped exits 2 with
     no final model and no summary (reward failing, or no reward at all)
  W1 the safetensors writer fails (SafetensorError, disk full) while writing the policy:
     one line, exit 2, the temp folder removed, resume exact
  W2 a file-size limit below the policy's weights (RLIMIT_FSIZE, a subprocess): the same
  E1 `replayrl eval --data` and a run's own eval split skip and count prompts that do not fit
  Y2 a Ray run asking for resources no node has (a GPU here) is refused at start naming
     them; with ray.placement_timeout it waits that long for the cluster to grow, saying so
  G1 a second SIGTERM (during the final step, or landing in a finalizer): stopped at once,
     one line, exit 143, no traceback
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replayrl.cli.main import main
from replayrl.config.schema import load_config
from replayrl.run.distributed.placement import actor_requests, check_placement, shortfall
from replayrl.run.metrics import read_metrics
from replayrl.run.start import train
from replayrl.storage.checkpoint import latest_checkpoint, load_state
from test_faults import args, cli, env, one_error_line, resume_under_file_size_limit

# None for odd positions in a call, a parity reward (with variance) for the rest
SOME_NONE = (
    "def some(completions, **kw):\n"
    "    return [None if i % 2 else float(sum(map(ord, str(c))) % 2)\n"
    "            for i, c in enumerate(completions)]\n"
)
ALL_NONE = "def never(completions, **kw):\n    return [None] * len(completions)\n"


def reward_file(tmp_path: Path, source: str, fn: str) -> str:
    path = tmp_path / f"{fn}.py"
    path.write_text(source)
    return f"rewards=[{{name: '{path}:{fn}'}}]"


def test_rollouts_without_any_reward_are_skipped_and_counted(tmp_path: Path, capsys):  # N1
    argv = args(tmp_path, "some", "train.steps=2", reward_file(tmp_path, SOME_NONE, "some"))
    code, out, err = cli(["train", *argv], capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "some/summary.json").read_text())
    # 2 steps x 8 rollouts, every second one without a reward: skipped, not trained as 0
    assert s["rollouts_generated"] == 16 and s["rollouts_dropped_no_reward"] == 8
    assert s["rollouts_dropped_reward_error"] == 0 and s["first_reward_error"] is None
    led = s["accounting"]["ledger"]
    assert led["dropped_no_reward"] == 8 and led["pushed"] == 8 and led["balanced"]
    assert "no reward (every function returned None) 8" in out
    assert out.count("all reward functions returned None for 4 of 8 completions") == 1
    last = [r for r in read_metrics(tmp_path / "some/metrics.jsonl") if "reward/mean" in r][-1]
    assert last["rollouts/dropped_no_reward"] == 8.0
    assert s["tokens_trained"] > 0


def test_no_reward_at_all_for_patience_steps_ends_the_run(tmp_path: Path, capsys):  # N2
    argv = args(tmp_path, "never", "train.steps=6", reward_file(tmp_path, ALL_NONE, "never"))
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2
    assert "all reward functions returned None for every completion for 3 steps in a row" in line
    assert not (tmp_path / "never/summary.json").exists()


@pytest.mark.parametrize(
    ("source", "fn", "cause"),
    [
        ("def boom(completions, **kw):\n    raise ValueError('no')\n", "boom", "ValueError: no"),
        (ALL_NONE, "never", "all reward functions returned None for every completion"),
    ],
    ids=["reward-fails", "no-reward"],
)
def test_a_short_run_that_trained_nothing_fails(tmp_path: Path, capsys, source, fn, cause):  # T1
    # 2 steps < train.failure_patience (3): the streak rules never fire, the end-of-run does
    argv = args(tmp_path, fn, "train.steps=2", reward_file(tmp_path, source, fn))
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2 and "nothing was trained in 2 step(s)" in line and cause in line
    assert not (tmp_path / fn / "final").exists()
    assert not (tmp_path / fn / "summary.json").exists()


# -- storage errors while checkpointing ----------------------------------------------------


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step run with complete checkpoints at steps 1 and 2."""
    root = tmp_path_factory.mktemp("edges")
    cfg = load_config(None, args(root, "base", "train.steps=2", "checkpoint.every=1"))
    train(cfg, log=lambda _: None)
    assert latest_checkpoint(root / "base").name == "step_000002"
    return root / "base"


def test_safetensors_error_while_writing_the_policy(
    two_steps: Path, tmp_path: Path, capsys, monkeypatch
):  # W1
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError

    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    real = mu.safe_save_file

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # half-written, as a full disk leaves it
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(mu, "safe_save_file", full_disk)
    code, _, err = cli(["train", "--resume", str(run), "train.steps=3"], capsys)
    line = one_error_line(err)  # no traceback
    assert code == 2 and "could not write checkpoint" in line and "step_000003" in line
    assert "SafetensorError" in line and "No space left on device" in line
    assert "the last good checkpoint is" in line and "step_000002" in line
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert latest_checkpoint(run).name == "step_000002"
    monkeypatch.setattr(mu, "safe_save_file", real)
    assert cli(["train", "--resume", str(run), "train.steps=3"], capsys)[0] == 0
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]
    assert steps == [1, 2, 3]  # step 3 once: nothing lost, nothing repeated


def test_file_size_limit_below_the_policy_weights(two_steps: Path, tmp_path: Path):  # W2
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    weights = run / "checkpoints/step_000002/policy/model.safetensors"
    limit = weights.stat().st_size // 2  # the weights do not fit (safetensors reports EFBIG)
    proc = resume_under_file_size_limit(run, limit, 3)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert "could not write checkpoint" in line and "step_000003" in line
    assert "File too large" in line and "step_000002" in line
    assert latest_checkpoint(run).name == "step_000002"
    assert load_state(run / "checkpoints/step_000002")["step"] == 2


# -- prompts too long to evaluate ------------------------------------------------------------


def sums(path: Path, short: int, long: int) -> Path:
    """`short` rows that fit the tiny model (128 positions), then `long` rows that do not."""
    rows = [{"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1)} for a in range(10, 10 + short)]
    rows += [{"prompt": "1+" * 150 + "1=", "answer": "151"} for _ in range(long)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_skips_and_counts_prompts_that_do_not_fit(two_steps: Path, tmp_path: Path, capsys):
    # E1: `replayrl eval --data`
    out = tmp_path / "res.json"
    data = sums(tmp_path / "mixed.jsonl", 5, 2)
    code = main(["eval", "--model", str(two_steps), "--data", str(data), "--out", str(out)])
    assert code == 0
    assert (
        "2 of 7 eval prompts are longer than the model's 128 positions" in capsys.readouterr().out
    )
    res = json.loads(out.read_text())
    assert res["num_prompts"] == 5 and res["prompts_skipped_too_long"] == 2
    assert len(res["completions"]) == 5
    assert all(len(c["prompt"]) < 100 for c in res["completions"])
    # nothing left to score: one line naming the file, exit 2
    data = sums(tmp_path / "long.jsonl", 0, 3)
    code = main(["eval", "--model", str(two_steps), "--data", str(data), "--out", str(out)])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and str(data) in line and "3 of 3 eval prompts are longer" in line


def test_a_runs_eval_split_skips_and_counts_prompts_that_do_not_fit(
    two_steps: Path, tmp_path: Path, capsys
):
    # E1: the run's own held-out split (task.dataset.eval_path)
    train_file, eval_file = sums(tmp_path / "t.jsonl", 8, 0), sums(tmp_path / "e.jsonl", 4, 3)
    argv = args(
        tmp_path,
        "ds",
        "train.steps=1",
        f"model.path={two_steps / 'final'}",  # a dataset task has no built-in warm start
        "task.name=dataset",
        f"task.dataset.path={train_file}",
        f"task.dataset.eval_path={eval_file}",
    )
    code, out, err = cli(["train", *argv], capsys)
    assert code == 0, err
    assert "3 of 7 eval prompts are longer than the model's 128 positions" in out
    s = json.loads((tmp_path / "ds/summary.json").read_text())
    assert s["num_eval_prompts"] == 4 and s["eval_prompts_skipped_too_long"] == 3


# -- a Ray run the cluster cannot place ------------------------------------------------------


def ray_cfg(*extra: str):
    return load_config(None, ["runtime=ray", "workers.generators=2", *extra])


def test_placement_names_what_the_cluster_lacks():  # Y2 (unit: no cluster)
    cfg = ray_cfg("ray.generator_num_gpus=1")
    why = shortfall(actor_requests(cfg), [{"CPU": 8.0, "memory": 1e9}])
    assert why is not None and "missing GPU 2" in why
    assert "2 generators: CPU 1, GPU 1 each" in why and "1 learner: CPU 1 each" in why
    assert "ray.placement_timeout" in why
    assert shortfall(actor_requests(cfg), [{"CPU": 8.0, "GPU": 2.0}]) is None
    # enough in total, but no one node holds a 4-CPU learner
    big = actor_requests(ray_cfg("ray.learner_num_cpus=4", "ray.generator_num_cpus=0"))
    why = shortfall(big, [{"CPU": 3.0}, {"CPU": 3.0}])
    assert why is not None and "no node has room for a learner (CPU 4)" in why
    assert shortfall(big, [{"CPU": 3.0}, {"CPU": 4.0}]) is None


def test_placement_waits_only_when_told_and_says_so():  # Y2 (unit: a cluster that grows)
    logs: list[str] = []
    now = [0.0]
    sizes = iter([[{"CPU": 8.0}], [{"CPU": 8.0}], [{"CPU": 8.0}, {"GPU": 2.0, "CPU": 4.0}]])

    def sleep(s: float) -> None:
        now[0] += s

    grows = ray_cfg("ray.generator_num_gpus=1", "ray.placement_timeout=60")
    check_placement(grows, lambda: next(sizes), logs.append, sleep, lambda: now[0])
    assert "waiting up to 60 s (ray.placement_timeout)" in logs[0] and "missing GPU 2" in logs[0]
    assert logs[-1] == "the Ray cluster can now place the run" and 0 < now[0] < 60
    # without the key: refused at once, no wait
    now[0] = 0.0
    with pytest.raises(ValueError, match="cannot place this run.*missing GPU 2"):
        check_placement(
            ray_cfg("ray.generator_num_gpus=1"),
            lambda: [{"CPU": 8.0}],
            logs.append,
            sleep,
            lambda: now[0],
        )
    assert now[0] == 0.0
    with pytest.raises(ValueError, match="after waiting 5 s"):
        check_placement(
            ray_cfg("ray.generator_num_gpus=1", "ray.placement_timeout=5"),
            lambda: [{"CPU": 8.0}],
            logs.append,
            sleep,
            lambda: now[0],
        )


@pytest.mark.ray
def test_a_ray_run_asking_for_a_gpu_on_a_machine_without_one_is_refused(
    tmp_path: Path, capsys
):  # Y2: the README's Ray + GPU command on a machine without GPUs once waited forever
    argv = args(
        tmp_path,
        "ray",
        "runtime=ray",
        "ray.num_cpus=2",
        "ray.generator_num_gpus=1",
        "ray.generator_num_cpus=0.5",
        "ray.learner_num_cpus=0.5",
    )
    code, _, err = cli(["train", *argv], capsys)
    line = [x for x in err.splitlines() if x.startswith("error: ")]
    assert code == 2 and line, err[-3000:]
    assert "the Ray cluster cannot place this run" in line[0] and "missing GPU 1" in line[0]
    assert "Traceback" not in err


# -- a second signal -------------------------------------------------------------------------

SECOND_IN_A_FINALIZER = """
import signal
from replayrl.run.session import StopOnSignal

class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the second signal lands in a finalizer
        done = True  # its handler runs here, inside __del__

with StopOnSignal():
    signal.raise_signal(signal.SIGTERM)  # the first: stop after this step
    Finalized()  # collected at once
    print("went on after the second signal")
"""


def test_a_second_signal_in_a_finalizer_stops_at_once_in_one_line():  # G1
    # raised as an exception, it landed in __del__: Python printed "Exception ignored ...
    # Traceback ... RunStopped: 15" and went on
    proc = subprocess.run(
        [sys.executable, "-c", SECOND_IN_A_FINALIZER],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "went on" not in proc.stdout
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines == [
        "interrupted (SIGTERM again): stopped at once, without a checkpoint; --resume "
        "continues from the newest complete one"
    ]


HANGS_AT_STEP_3 = (
    "import time\nfrom pathlib import Path\n"
    "def stuck(completions, **kw):\n"
    "    calls = Path(__file__).with_suffix('.calls')\n"
    "    n = int(calls.read_text()) + 1 if calls.exists() else 1\n"
    "    calls.write_text(str(n))\n"
    "    if n == 3:\n"
    "        time.sleep(3600)  # the final step never ends by itself\n"
    "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
)


def test_a_second_sigterm_during_the_final_step_stops_it_cleanly(tmp_path: Path):  # G1
    argv = args(
        tmp_path,
        "g",
        "train.steps=3",
        "rollout.reward_timeout_s=null",
        reward_file(tmp_path, HANGS_AT_STEP_3, "stuck"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "replayrl", "train", *argv],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        calls = tmp_path / "stuck.calls"
        deadline = time.monotonic() + 240
        while not (calls.is_file() and calls.read_text() == "3"):  # inside the final step
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # asks to stop after the step: it never ends
        # so a second one stops it; two signals sent before the first is handled merge into
        # one (a slow machine), so send again until the process ends rather than guess a wait
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "RunStopped" not in err
    assert "SIGTERM: stopping after this step" in out
    assert "interrupted (SIGTERM again): stopped at once, without a checkpoint" in err
    assert latest_checkpoint(tmp_path / "g") is None  # checkpoint.every=0: nothing half-made
    assert not [p for p in (tmp_path / "g").rglob(".step_*")]
