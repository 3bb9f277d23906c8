"""Fault injection, part 2, through the CLI: preemption, one process per run
folder, no deletes outside a run, no silent non-training.

Catalogue (each test names its case ids):
  P1 SIGTERM mid-run (checkpoint.every=0): exit 143, checkpoint, resume == uninterrupted
  P2 SIGHUP mid-run: exit 129, checkpoint, resume continues
  P3 SIGTERM mid-run, runtime=async-local: exit 143, checkpoint
  L1 second start (overwrite) of a running folder refused  L2 second resume refused
  L3 lock file left by a dead process does not block
  D1 logging.name=. / ../x / a/b refused   D2 overwrite of a folder that is not a run refused
  D3 symlinked checkpoints/ refused on resume  D4 symlinked run folder never overwritten
  S1 GRPO with num_generations=1 refused   S2 batch larger than the buffer refused
  S3 reward raising on every call ends the run naming it (RewardFunctionFailed)
  S4 reward of the wrong length on every call: real lengths in the error
  S5 reward 1e39 (inf in float32) and 1e308 x weight 10 dropped, counted
  S6 NaN policy weights: every update skipped -> error naming the cause
  S7 train.lr=1e6: zero gradient with non-zero advantages -> error (or skipped updates)
  R1 reward calling sys.exit with the timeout off   R2 reward clearing its completions
  R3 non-daemon thread started by a reward: the program still exits
  C1 resume of a run folder naming reward code, received from another user (another trust
     key): refused without --trust-run-code; relative paths from the recorded start folder; a
     changed reward file runs only with consent (signed folders of one's own: test_trust.py)
  C2 fixed keys checked against the checkpoint's record; accepted changes printed
  C3 same-size corruption (weights, safetensors header): fallback to the previous checkpoint
  C4 leftover .step_*.tmp-* folders removed   C5 200,000-deep state JSON: a clear error
  C6 pruning keeps complete checkpoints over damaged ones   C7 a 2 MB dataset row skipped
  I1 a reward calling os._exit(0), segfaulting or hanging on every call (its own worker
     process): RewardFunctionFailed saying how the worker ended, exit 2, no summary
  I2 a worker that dies once is restarted; only that call's rollouts are dropped
  I3 Python callables from the API run isolated with no pickling (closures)
  I4 a stray thread lives and ends in the worker process (R3 with reward_isolation=process)
  I5 workers fork from a server started before the model loads: a worker's private memory
     does not grow when the trainer writes a 100 MB tensor it allocated after the rewards
  I6 what a reward prints reaches stdout and stderr redirected to files (no PYTHONUNBUFFERED)
  I7 a reward call works when its pipes' descriptors are >= 1024 (select() refuses them)
  I8 a fork server killed from outside: that call's rollouts dropped, a new server after
  A1 async-local: RewardFunctionFailed keeps its type and message, exit 2 as in sync
  Y1 Ray driver stopped by SIGTERM exits 143 (a stand-in for ray; no cluster here)
  C8 checkpoints written before content hashes: a damaged header or JSON falls back
  S8 zero gradient with non-zero advantages under GAE (PPO) ends the run
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replayrl.cli.main import main
from replayrl.errors import RewardFunctionFailed
from replayrl.rollout.rewards import WeightedReward, score
from replayrl.run.metrics import read_metrics
from replayrl.run.records.folder import lock_path, run_lock
from replayrl.storage.checkpoint import latest_checkpoint, load_state
from test_faults import cli, one_error_line
from tiny import TINY_RUN

SRC = str(Path(__file__).resolve().parents[1] / "src")
BASE = [*TINY_RUN, "train.threads=1", "method.name=replay", "buffer.capacity=16"]
# a reward with variance (parity of the text; the tiny warm start is never right) that also
# sleeps, so that a signal lands mid-run on any machine
SLOW_REWARD = (
    "import time\n"
    "def slow(completions, **kw):\n"
    "    time.sleep({s})\n"
    "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
)


def args(run_root: Path, name: str, *extra: str) -> list[str]:
    return [*BASE, f"logging.run_dir={run_root}", f"logging.name={name}", *extra]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}


def records(run: Path) -> dict[int, dict]:
    """Step metrics without timings (the only fields that differ between identical runs)."""
    out = {}
    for r in read_metrics(run / "metrics.jsonl"):
        if "reward/mean" in r:
            out[r["step"]] = {
                k: v for k, v in r.items() if not k.startswith("time/") and "seconds" not in k
            }
    return out


def slow_rewards(tmp_path: Path, seconds: float) -> str:
    path = tmp_path / "slow.py"
    path.write_text(SLOW_REWARD.format(s=seconds))
    return f"rewards=[{{name: '{path}:slow'}}]"


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replayrl.cli.main", "train", *argv],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(run: Path, proc: subprocess.Popen, step: int) -> None:
    """Until metrics.jsonl has a record of `step` (the step marker)."""
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        path = run / "metrics.jsonl"
        if path.is_file() and any(
            r.get("step", 0) >= step and "reward/mean" in r for r in read_metrics(path)
        ):
            return
        time.sleep(0.05)


# -- preemption ----------------------------------------------------------------------------


def test_sigterm_checkpoints_and_resumes_like_an_uninterrupted_run(
    tmp_path: Path, capsys
):  # P1, L1, L2
    steps = 12
    extra = [f"train.steps={steps}", "checkpoint.every=0", slow_rewards(tmp_path, 0.25)]
    proc = start(args(tmp_path, "stopped", *extra))
    run = tmp_path / "stopped"
    try:
        wait_for_step(run, proc, 2)
        # L1, L2: while it runs, a second start or resume of the folder is refused
        code, _, err = cli(["train", *args(tmp_path, "stopped", "logging.overwrite=true")], capsys)
        line = one_error_line(err)
        assert code == 2 and f"in use by pid {proc.pid}" in line
        code, _, err = cli(["train", "--resume", str(run)], capsys)
        assert code == 2 and f"in use by pid {proc.pid}" in one_error_line(err)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err
    stopped = latest_checkpoint(run)
    assert stopped is not None  # written although checkpoint.every=0
    at = load_state(stopped)["counters"]["step"]
    assert 2 <= at < steps and f"interrupted at step {at} (SIGTERM): checkpoint written" in out
    assert not lock_path(run).exists()  # released
    code, _, err = cli(["train", "--resume", str(run), "--trust-run-code"], capsys)
    assert code == 0, err
    code, _, err = cli(["train", *args(tmp_path, "straight", *extra)], capsys)
    assert code == 0, err
    a, b = records(tmp_path / "straight"), records(run)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    assert a == b  # the same trajectory, step for step
    assert a[steps]["train/loss"] != a[steps - 1]["train/loss"]  # not trivially equal


def test_sighup_stops_after_the_step_with_a_checkpoint(tmp_path: Path, capsys):  # P2
    proc = start(args(tmp_path, "hup", "train.steps=400", slow_rewards(tmp_path, 0.05)))
    run = tmp_path / "hup"
    try:
        wait_for_step(run, proc, 1)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 129 and "Traceback" not in err, err[-3000:]
    at = load_state(latest_checkpoint(run))["counters"]["step"]
    argv = ["train", "--resume", str(run), f"train.steps={at + 1}", "--trust-run-code"]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    assert sorted(records(run)) == list(range(1, at + 2))


def test_sigterm_in_async_local(tmp_path: Path):  # P3
    """SIGTERM to the whole process group, as SLURM sends it: the workers leave the stop to
    the learner (none dies and is restarted), which checkpoints and exits 143."""
    extra = ["runtime=async-local", "train.batch_size=8", "train.steps=400"]
    argv = args(tmp_path, "async", *extra, slow_rewards(tmp_path, 0.05))
    proc = subprocess.Popen(
        [sys.executable, "-m", "replayrl.cli.main", "train", *argv],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, workers included
    )
    run = tmp_path / "async"
    try:
        wait_for_step(run, proc, 1)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and "(SIGTERM): checkpoint written" in out
    counters = load_state(ckpt)["counters"]
    assert counters["step"] >= 1
    # no worker was killed by the signal: none died, none lost the batch it was producing
    assert "died" not in out + err and counters["rollouts_lost_worker_died"] == 0


# -- one process per run folder -------------------------------------------------------------


def test_stale_lock_file_does_not_block(tmp_path: Path):  # L3
    run = tmp_path / "r"
    lock_path(run).parent.mkdir(parents=True, exist_ok=True)
    lock_path(run).write_text("999999999\n")  # left by a process killed with -9
    with run_lock(run) as path:
        assert path.read_text().strip() == str(os.getpid())
        with pytest.raises(Exception, match=f"in use by pid {os.getpid()}"):
            with run_lock(tmp_path / "." / "r"):  # the same folder named another way
                pass
    assert not path.exists()


# -- no deletes outside a run -----------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "../x", "a/b", "", ".hidden"])
def test_logging_name_must_be_a_plain_folder_name(tmp_path: Path, capsys, name: str):  # D1
    root = tmp_path / "runs"
    (root / "other").mkdir(parents=True)
    (root / "other" / "config.yaml").write_text("train: {}\nlogging: {}\n")
    (tmp_path / "x").mkdir()
    argv = ["train", *args(root, name, "logging.overwrite=true")]
    code, _, err = cli(argv, capsys)
    assert code == 2 and "logging.name" in err and "Traceback" not in err
    assert (root / "other" / "config.yaml").is_file() and (tmp_path / "x").is_dir()


def test_overwrite_only_replaces_a_run_folder(tmp_path: Path, capsys):  # D2, D4
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("years of work")
    code, _, err = cli(["train", *args(tmp_path, "notes", "logging.overwrite=true")], capsys)
    line = one_error_line(err)
    assert code == 2 and "not a replayrl run folder" in line and "nothing was deleted" in line
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "years of work"
    (tmp_path / "link").symlink_to(tmp_path / "notes")
    code, _, err = cli(["train", *args(tmp_path, "link", "logging.overwrite=true")], capsys)
    assert code == 2 and "is a symlink" in one_error_line(err)
    assert (tmp_path / "notes" / "thesis.tex").is_file()


def test_symlinked_checkpoints_folder_is_refused(tmp_path: Path, capsys):  # D3
    code, _, err = cli(["train", *args(tmp_path, "a", "train.steps=1")], capsys)
    assert code == 0, err
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints")
    (tmp_path / "b" / "checkpoints").symlink_to(tmp_path / "a" / "checkpoints")
    before = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    code, _, err = cli(["train", "--resume", str(tmp_path / "b"), "train.steps=4"], capsys)
    line = one_error_line(err)
    assert code == 2 and "checkpoints is a symlink" in line
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == before


# -- no silent non-training ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["rollout.num_generations=1"], "a group of one completion has advantage 0"),  # S1
        (["buffer.capacity=1"], "is larger than buffer.capacity=1"),  # S2
        (["train.batch_size=32"], "B=32 is larger than buffer.capacity=16"),  # S2
    ],
)
def test_settings_that_train_nothing_are_refused(tmp_path, capsys, extra, message):
    code, _, err = cli(["train", *args(tmp_path, "x", *extra)], capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_reward_failing_on_every_call_ends_the_run(tmp_path: Path, capsys):  # S3, S4
    rewards = tmp_path / "bad.py"
    rewards.write_text(
        "def boom(completions, **kw):\n    raise KeyError('answer_col')\n"
        "def short(completions, **kw):\n    return [1.0] * (len(completions) + 3)\n"
    )
    for fn, first in (
        ("boom", "KeyError: 'answer_col' [error]"),
        ("short", "returned list of 11 values for 8 completions [wrong_length]"),
    ):
        argv = args(tmp_path, fn, "train.steps=6", f"rewards=[{{name: '{rewards}:{fn}'}}]")
        code, _, err = cli(["train", *argv], capsys)
        line = one_error_line(err)
        assert code == 2, err
        assert f"reward function '{rewards}:{fn}' failed on every call for 3 steps" in line
        assert f"first error: {first}" in line
        assert not (tmp_path / fn / "summary.json").exists()


def test_reward_failure_streak_is_a_run_failed_subclass():  # S3 (unit: the API relies on it)
    wr = WeightedReward("f", lambda completions, **_: [1.0] * (len(completions) + 1))
    ok = WeightedReward("g", lambda completions, **_: [0.0] * len(completions))
    for _ in range(2):
        score([wr, ok], ["p", "q"], ["a", "b"], [{}, {}], timeout_s=None, patience=3)
    with pytest.raises(RewardFunctionFailed) as info:
        score([wr, ok], ["p", "q"], ["a", "b"], [{}, {}], timeout_s=None, patience=3)
    assert info.value.name == "f" and info.value.steps == 3
    assert "returned list of 3 values for 2 completions" in info.value.first_error
    assert ok.failed_steps == 0
    # one call that succeeds somewhere resets the streak
    wr.fn = lambda completions, **_: [1.0, None] if len(completions) == 2 else [1.0]
    score([wr], ["p", "q"], ["a", "b"], [{}, {}], timeout_s=None, patience=3)
    assert wr.failed_steps == 0


@pytest.mark.parametrize(
    ("values", "weight", "kept", "why"),
    [
        # S5: finite in float64, inf in float32 (the learner's dtype)
        ([1e39, 1.0], 1.0, [None, 1.0], "returned float32-overflowing (inf in training)"),
        ([1e308, 1.0], 10.0, [None, 10.0], "float32-overflowing"),
        # S5: each value fits float32, the weighted sum does not
        ([3e38, 1.0], 10.0, [None, 10.0], "weighted reward sum 3e+39 is not finite in float32"),
        ([3e38, 1.0], 1.0, [3e38, 1.0], None),  # the largest float32s still pass
    ],
)
def test_rewards_are_checked_after_weighting_in_float32(values, weight, kept, why):
    res = score([WeightedReward("f", lambda **_: values, weight)], ["p"] * 2, ["a"] * 2, [{}] * 2)
    assert res.rewards == kept
    assert res.reasons.get("non_finite", 0) == kept.count(None) == res.errors
    assert (why is None and res.first_error is None) or why in res.first_error


def test_nan_policy_weights_end_the_run(tmp_path: Path, capsys):  # S6
    import torch
    from safetensors.torch import load_file, save_file

    code, _, err = cli(["train", *args(tmp_path, "src", "train.steps=1")], capsys)
    assert code == 0, err
    policy = tmp_path / "nan_policy"
    shutil.copytree(latest_checkpoint(tmp_path / "src") / "policy", policy)
    weights = load_file(policy / "model.safetensors")
    weights = {k: torch.full_like(v, float("nan")) for k, v in weights.items()}
    save_file(weights, policy / "model.safetensors", metadata={"format": "pt"})
    argv = args(tmp_path, "nan", f"model.path={policy}", "train.steps=10")
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2 and "nothing was trained for 3 steps in a row" in line
    assert "gradient was not finite" in line
    assert not (tmp_path / "nan" / "summary.json").exists()


def test_wrecking_learning_rate_ends_the_run(tmp_path: Path, capsys):  # S7
    # a reward with variance (the tiny warm start is never right): advantages are not 0
    rewards = tmp_path / "parity.py"
    rewards.write_text(
        "def parity(completions, **kw):\n"
        "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
    )
    reward = f"rewards=[{{name: '{rewards}:parity'}}]"
    argv = args(tmp_path, "lr", "train.lr=1e6", "train.steps=30", reward)
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2 and "nothing was trained for 3 steps in a row" in line
    assert "gradient was exactly 0 although the batch's advantages were not" in line
    assert "train.lr=1e+06" in line
    steps = [r["step"] for r in read_metrics(tmp_path / "lr" / "metrics.jsonl") if r["step"]]
    assert max(steps) < 30


# -- reward-function hazards -----------------------------------------------------------------


def test_reward_hazards_do_not_end_the_run(tmp_path: Path, capsys):  # R1, R2
    rewards = tmp_path / "hazards.py"
    rewards.write_text(
        "import sys\n"
        "def leave(completions, **kw):\n    sys.exit(3)\n"
        "def clear(prompts, completions, **kw):\n"
        "    n = len(completions)\n    completions.clear()\n    prompts.clear()\n"
        "    return [1.0] * n\n"
    )
    argv = args(
        tmp_path,
        "hz",
        "train.steps=2",
        "rollout.reward_timeout_s=null",
        f"rewards=[{{name: '{rewards}:leave', weight: 1.0}}, {{name: '{rewards}:clear'}}]",
    )
    code, out, err = cli(["train", *argv], capsys)
    # the program survived both (a clear error, not an exit with the reward's status 3); as
    # `leave` dropped every rollout, nothing was trained, which fails the run, naming it
    line = one_error_line(err)
    assert code == 2 and "nothing was trained in 2 step(s)" in line and "SystemExit: 3" in line
    last = [r for r in read_metrics(tmp_path / "hz" / "metrics.jsonl") if r["step"]][-1]
    assert last["rollouts/dropped_reward_error"] == 16


# -- resume runs no foreign code; fixed keys against the checkpoint ---------------------------

CANARY_REWARD = (
    "from pathlib import Path\n"
    "Path({canary!r}).touch()\n"  # importing this file is running foreign code
    "def fn(completions, **kw):\n"
    "    return [0.0] * len(completions)\n"
)


@pytest.fixture(scope="module")
def coded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step run started in `start/` with a relative reward file (parity.py)."""
    root = tmp_path_factory.mktemp("coded")
    (root / "start").mkdir()
    (root / "start" / "parity.py").write_text(
        "def parity(completions, **kw):\n"
        "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
    )
    old = Path.cwd()
    os.chdir(root / "start")
    try:
        argv = args(root, "coded", "train.steps=2", "rewards=[{name: 'parity.py:parity'}]")
        assert main(["train", *argv]) == 0
    finally:
        os.chdir(old)
    return root / "coded"


def test_resume_runs_no_code_from_the_run_folder_without_consent(
    coded_run: Path, tmp_path: Path, capsys, monkeypatch
):  # C1
    run = copy_run(coded_run, tmp_path)
    # a folder received from another user: its signed record does not verify with this key
    monkeypatch.setenv("REPLAYRL_TRUST_KEY", str(tmp_path / "other-user-key"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    canary = tmp_path / "foreign_code_ran"
    # a different parity.py where the resume is run from: must never be imported
    (elsewhere / "parity.py").write_text(CANARY_REWARD.format(canary=str(canary)))
    monkeypatch.chdir(elsewhere)
    code, _, err = cli(["train", "--resume", str(run), "train.steps=3"], capsys)
    line = one_error_line(err)
    started = str(coded_run.parent / "start" / "parity.py")  # the recorded folder's file
    assert code == 2 and f"names reward code ({started}:parity)" in line
    assert "--trust-run-code" in line
    # consent: the file the run was started with (recorded folder), not ./parity.py
    argv = ["train", "--resume", str(run), "train.steps=3", "--trust-run-code"]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    assert not canary.exists()
    assert f"{started}:parity" in (run / "config.yaml").read_text()
    # a config.yaml edited to name other code is refused without consent, never imported
    evil = tmp_path / "evil.py"
    evil.write_text(CANARY_REWARD.format(canary=str(canary)))
    text = (run / "config.yaml").read_text().replace(f"{started}:parity", f"{evil}:fn")
    (run / "config.yaml").write_text(text)
    code, _, err = cli(["train", "--resume", str(run), "train.steps=4"], capsys)
    assert code == 2 and "evil.py:fn" in one_error_line(err)
    assert not canary.exists()


def test_reward_file_changed_since_the_start_runs_only_with_consent(
    coded_run: Path, tmp_path: Path, capsys, monkeypatch
):
    run = copy_run(coded_run, tmp_path)  # C1: content hash recorded at start
    monkeypatch.setenv("REPLAYRL_TRUST_KEY", str(tmp_path / "other-user-key"))  # not signed
    origin = json.loads((run / "origin.json").read_text())
    started = coded_run.parent / "start" / "parity.py"
    assert origin["reward_files"] == {
        str(started): __import__("hashlib").sha256(started.read_bytes()).hexdigest()
    }
    origin["reward_files"][str(started)] = "0" * 64  # as if the file had changed since
    (run / "origin.json").write_text(json.dumps(origin))
    # consent (--trust-run-code) runs it as it is now, saying which file changed
    argv = ["train", "--resume", str(run), "train.steps=3", "--trust-run-code"]
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    assert f"warning: reward file {started} changed since the run started" in out
    # giving the rewards again is consent to the file as it is now
    argv = [
        "train",
        "--resume",
        str(run),
        "train.steps=4",
        f"rewards=[{{name: '{started}:parity'}}]",
    ]
    code, _, err = cli(argv, capsys)
    assert code == 0, err


def test_fixed_keys_are_checked_against_the_checkpoint_record(
    coded_run: Path, tmp_path: Path, capsys
):  # C2
    run = copy_run(coded_run, tmp_path)
    cfg_text = (run / "config.yaml").read_text()
    assert "hidden_size: 32" in cfg_text
    (run / "config.yaml").write_text(cfg_text.replace("hidden_size: 32", "hidden_size: 64"))
    code, _, err = cli(["train", "--resume", str(run), "--trust-run-code"], capsys)
    line = one_error_line(err)
    assert code == 2 and "model.tiny" in line and "'hidden_size': 32" in line
    # an accepted change (here the loss, edited into config.yaml) is printed
    edited = cfg_text.replace("loss_type: grpo_clip", "loss_type: asymre")
    assert edited != cfg_text
    (run / "config.yaml").write_text(edited)
    argv = ["train", "--resume", str(run), "--trust-run-code", "train.steps=3"]
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    assert "settings changed since the checkpoint (accepted)" in out
    assert "algorithm.loss_type: 'grpo_clip' -> 'asymre'" in out
    assert "train.steps: 2 -> 3" in out


# -- checkpoints: contents, leftovers, pruning ------------------------------------------------


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run with complete checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("ckpt")
    argv = args(root, "base", "train.steps=4", "checkpoint.every=2")
    assert main(["train", *argv]) == 0
    return root / "base"


def copy_run(base: Path, tmp_path: Path, name: str = "run") -> Path:
    dest = tmp_path / name
    shutil.copytree(base, dest)
    return dest


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("file", "offset"),
    [
        ("policy/model.safetensors", -5),  # C3: same-size corruption of the weights
        ("state.safetensors", 3),  # C3: a damaged safetensors header, same size
    ],
)
def test_same_size_corruption_falls_back_to_the_previous_checkpoint(
    base_run: Path, tmp_path: Path, capsys, file: str, offset: int
):
    run = copy_run(base_run, tmp_path)
    last = run / "checkpoints/step_000004"
    size = (last / file).stat().st_size
    _flip_byte(last / file, offset)
    assert (last / file).stat().st_size == size
    code, out, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    assert f"skipping checkpoint {last}: damaged file {file}" in out
    assert "resumed from" in out and "step_000002" in out


def test_leftover_temp_folders_are_removed_at_the_next_start(
    base_run: Path, tmp_path: Path, capsys
):  # C4
    run = copy_run(base_run, tmp_path)
    left = run / "checkpoints/.step_000005.tmp-abc123"
    (left / "policy").mkdir(parents=True)
    (left / "policy/model.safetensors").write_bytes(b"x" * 1000)
    keep = run / "checkpoints/.notes"  # not a checkpoint temp folder: left alone
    keep.mkdir()
    code, out, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    assert not left.exists() and keep.is_dir()
    assert f"removed {left}" in out


def test_deeply_nested_state_json_is_a_clear_error(base_run: Path, tmp_path: Path, capsys):
    run = copy_run(base_run, tmp_path)  # C5
    for ckpt in (run / "checkpoints").glob("step_*"):
        deep = '{"format": "replayrl-state", "version": 1, "state": ' + "[" * 200_000
        deep += "]" * 200_000 + "}"
        (ckpt / "state.json").write_text(deep)
        manifest = json.loads((ckpt / "manifest.json").read_text())  # a consistent manifest
        manifest["files"]["state.json"] = len(deep)
        manifest["sha256"].pop("state.json")
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    line = one_error_line(err)
    assert code == 2 and "nested too deeply" in line and "Traceback" not in err


def _fake_checkpoint(root: Path, step: int, complete: bool) -> Path:
    path = root / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "w").write_bytes(b"weights")
    size = 7 if complete else 99  # a manifest that does not match: damaged
    (path / "manifest.json").write_text(json.dumps({"format": 1, "files": {"w": size}}))
    return path


def test_pruning_keeps_complete_checkpoints_over_damaged_ones(tmp_path: Path):  # C6
    from replayrl.storage.checkpoint import _prune

    root = tmp_path / "checkpoints"
    old_damaged = _fake_checkpoint(root, 1, complete=False)
    good = _fake_checkpoint(root, 2, complete=True)
    _fake_checkpoint(root, 3, complete=True)  # just written (a resume fell back to step 2)
    newer_damaged = _fake_checkpoint(root, 4, complete=False)
    _prune(root, keep_last=2, name="step_000003")
    # the damaged step 4 does not count towards keep_last: step 2 (complete) stays
    assert good.is_dir() and newer_damaged.is_dir() and not old_damaged.exists()
    _prune(root, keep_last=1, name="step_000003")
    assert not good.exists() and (root / "step_000003").is_dir()


def test_huge_dataset_row_is_skipped_before_tokenising(base_run: Path, tmp_path: Path, capsys):
    data = tmp_path / "d.jsonl"  # C7: one 2 MB prompt among normal rows
    lines = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(20)]
    lines[7] = json.dumps({"prompt": "1" * 2_000_000 + "+1=", "answer": "2"})
    data.write_text("\n".join(lines) + "\n")
    model = base_run / "checkpoints/step_000004/policy"  # a model folder with a tokenizer
    argv = args(
        tmp_path, "ds", "task.name=dataset", f"task.dataset.path={data}", "task.eval_size=4"
    )
    code, out, err = cli(["train", *argv, f"model.path={model}", "train.steps=1"], capsys)
    assert code == 0, err
    assert "too_long=1" in out, out


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_stray_non_daemon_thread_does_not_hang_the_program(tmp_path: Path, isolation: str):  # R3
    rewards = tmp_path / "stray.py"
    rewards.write_text(
        "import threading, time\n"
        "def stray(completions, **kw):\n"
        "    threading.Thread(target=time.sleep, args=(3600,), name='sleeper').start()\n"
        "    return [0.0] * len(completions)\n"
    )
    argv = args(
        tmp_path,
        "stray",
        "train.steps=1",
        "rollout.reward_timeout_s=null",  # called in the main thread: its threads are not daemons
        f"rollout.reward_isolation={isolation}",
        f"rewards=[{{name: '{rewards}:stray'}}]",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "replayrl", "train", *argv],
        env=env(),
        capture_output=True,
        text=True,
        timeout=240,  # without the fix: never returns (the thread sleeps an hour)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if isolation == "thread":
        assert "exiting without waiting for 1 non-daemon thread(s)" in proc.stderr
        assert "sleeper" in proc.stderr
    else:  # I4: the thread lived in the reward's worker process, which ended with the run
        assert "non-daemon" not in proc.stderr
    assert json.loads((tmp_path / "stray" / "summary.json").read_text())["steps"] == 1


# -- reward functions in worker processes (rollout.reward_isolation=process) -----------------

ENDINGS = {
    # I1: each ends or stalls the reward's worker process on every call
    "leave": ("import os\ndef leave(completions, **kw):\n    os._exit(0)\n", []),
    "crash": (
        "import ctypes\ndef crash(completions, **kw):\n    ctypes.string_at(0)\n",
        [],
    ),
    "hang": (
        "import time\ndef hang(completions, **kw):\n    time.sleep(3600)\n",
        ["rollout.reward_timeout_s=0.5"],
    ),
}


@pytest.mark.parametrize(
    ("fn", "first"),
    [
        ("leave", "its worker process exited with code 0 (os._exit"),
        ("crash", "its worker process was killed by SIGSEGV (a crash in native code)"),
        ("hang", "did not return within 0.5 s (its worker process was stopped"),
    ],
)
def test_reward_ending_its_process_ends_the_run_with_a_clear_error(
    tmp_path: Path, fn: str, first: str
):  # I1
    source, extra = ENDINGS[fn]
    rewards = tmp_path / f"{fn}.py"
    rewards.write_text(source)
    argv = args(tmp_path, fn, "train.steps=6", *extra, f"rewards=[{{name: '{rewards}:{fn}'}}]")
    proc = subprocess.run(
        [sys.executable, "-m", "replayrl", "train", *argv],
        env=env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    # a subprocess: without isolation os._exit(0) ends this very program with status 0
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    line = one_error_line(proc.stderr)
    assert f"reward function '{rewards}:{fn}' failed on every call for 3 steps" in line
    assert first in line
    assert not (tmp_path / fn / "summary.json").exists()


def test_reward_worker_that_dies_once_is_restarted(tmp_path: Path, capsys):  # I2
    rewards = tmp_path / "once.py"
    marker = tmp_path / "died_once"
    rewards.write_text(
        "import os\nfrom pathlib import Path\n"
        "def once(completions, **kw):\n"
        f"    if not Path({str(marker)!r}).exists():\n"
        f"        Path({str(marker)!r}).touch()\n"
        "        os._exit(7)\n"
        "    return [float(len(c) % 2) for c in completions]\n"
    )
    argv = args(tmp_path, "once", "train.steps=3", f"rewards=[{{name: '{rewards}:once'}}]")
    code, out, err = cli(["train", *argv], capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "once" / "summary.json").read_text())
    assert s["steps"] == 3 and s["rollouts_generated"] == 24
    assert s["rollouts_dropped_reward_error"] == 8  # the first call's, and only those
    assert "exited with code 7" in s["first_reward_error"]
    assert "[worker_died]" in s["first_reward_error"]


def test_python_callable_rewards_run_isolated_without_pickling(tmp_path: Path):  # I3
    from replayrl.api.trainer import ReplayConfig, ReplayTrainer

    bonus = 0.5  # a closure: cannot be pickled, needs no pickling with fork

    def closure(completions, **kw):
        return [bonus] * len(completions)

    def leave(completions, **kw):
        os._exit(0)

    tiny = [*TINY_RUN, "train.threads=1", "train.steps=2"]
    args_ = ReplayConfig("grpo", output_dir=str(tmp_path / "ok"), overrides=tiny)
    summary = ReplayTrainer(reward_funcs=[closure], args=args_).train()
    assert summary["rollouts_dropped_reward_error"] == 0
    records = read_metrics(tmp_path / "ok" / "metrics.jsonl")
    assert [r["reward/mean"] for r in records if "reward/mean" in r] == [0.5, 0.5]
    args_ = ReplayConfig("grpo", output_dir=str(tmp_path / "bad"), overrides=[*tiny[:-1]])
    with pytest.raises(RewardFunctionFailed) as info:  # the test process is still here
        ReplayTrainer(reward_funcs=[leave], args=args_).train()
    assert info.value.name == "leave" and "exited with code 0" in info.value.first_error


def test_reward_isolation_unit_cases():  # I1-I3 (unit: the scorer itself)
    import ctypes

    fns = {
        "ok": lambda completions, **_: [float(len(c)) for c in completions],
        "leave": lambda completions, **_: os._exit(4),
        "crash": lambda completions, **_: ctypes.string_at(0),
        "exit": lambda completions, **_: sys.exit(3),
        "text": lambda completions, **_: ["1.0", float("nan")],
    }
    out = {}
    for name, fn in fns.items():
        wr = WeightedReward(name, fn)
        # a generous timeout: none of these hangs, and a loaded machine must not turn a slow
        # fork into a "timeout"
        res = score([wr], ["p", "q"], ["ab", "c"], [{}, {}], timeout_s=60, isolation="process")
        out[name] = (res.rewards, res.reasons, res.first_error)
        if name == "ok":
            assert wr.worker is not None and wr.worker.pid != os.getpid()
    assert out["ok"][:2] == ([2.0, 1.0], {})
    assert out["leave"][1] == {"worker_died": 2} and "exited with code 4" in out["leave"][2]
    assert out["crash"][1] == {"worker_died": 2} and "SIGSEGV" in out["crash"][2]
    assert out["exit"][1] == {"error": 2} and "SystemExit: 3" in out["exit"][2]
    assert out["text"][1] == {"non_numeric": 1, "non_finite": 1}
    # built-ins stay in this process
    from replayrl.rollout.rewards import resolve_rewards

    (builtin,) = resolve_rewards([("digits_format", 1.0)])
    score([builtin], ["p"], ["12"], [{"answer": "12"}], isolation="process")
    assert builtin.builtin and builtin.worker is None


def pss_mb(pid: int) -> float:
    """A process's share of the memory it maps (a page shared by k processes counts 1/k)."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    kb = next(int(x.split()[1]) for x in text.splitlines() if x.startswith("Pss:"))
    return kb / 1024


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").is_file(), reason="Linux smaps_rollup")
def test_reward_worker_keeps_no_copy_of_memory_the_trainer_writes():  # I5
    import torch

    from replayrl.rollout.rewards import prepare_isolation

    wr = WeightedReward("len", lambda completions, **_: [float(len(c)) for c in completions])
    prepare_isolation([wr])  # as a run does: with its rewards, before the model loads
    big = torch.ones(25 * 2**20)  # 100 MB loaded after them: "the model"
    assert score([wr], ["p"], ["ab"], [{}], isolation="process").rewards == [2.0]
    assert wr.worker is not None and wr.worker.pid is not None
    pids = [wr.worker.pid, wr.worker.server.pid]
    before = sum(pss_mb(p) for p in pids)
    big.add_(1.0)  # "training": the trainer writes every page
    grew = sum(pss_mb(p) for p in pids) - before
    # a worker forked from the trainer after `big` keeps its old pages once they change
    # (+50 MB: shared with the trainer before, its own after); forked from a server forked
    # after `big`, worker and server share them (+33 MB); here neither ever had them
    assert grew < 12, grew
    assert score([wr], ["p"], ["abc"], [{}], isolation="process").rewards == [3.0]


def test_runs_fork_the_reward_server_before_the_model_loads(tmp_path: Path, monkeypatch):  # I5
    import torch

    from replayrl.rollout.rewards.isolation import live_servers
    from replayrl.run import components
    from replayrl.run.distributed import worker
    from tiny import tiny_config

    rewards = tmp_path / "mine.py"
    rewards.write_text("def mine(completions, **kw):\n    return [0.0] * len(completions)\n")
    seen: list[set[int]] = []

    class Loaded(Exception):
        pass

    def load_policy(*a, **kw):  # stands in for the model load; records the servers running
        seen.append({s.pid for s in live_servers() if [f.__name__ for f in s.fns] == ["mine"]})
        raise Loaded

    monkeypatch.setattr(components, "load_policy", load_policy)
    monkeypatch.setattr(worker, "load_policy", load_policy)
    cfg = tiny_config(tmp_path, f"rewards=[{{name: '{rewards}:mine'}}]")
    threads = torch.get_num_threads()
    try:
        with pytest.raises(Loaded):  # the synchronous runtime (and the Python API)
            components.build_components(cfg)
        with pytest.raises(Loaded):  # a generator worker of async-local and Ray
            worker.GeneratorWorker(cfg, 0)
        with pytest.raises(Loaded):  # thread: no server
            components.build_components(tiny_config(tmp_path, "rollout.reward_isolation=thread"))
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 3 and seen[0] and seen[1] - seen[0] and seen[2] <= seen[1], seen


def test_reward_output_reaches_a_redirected_stdout(tmp_path: Path):  # I6
    rewards, calls = tmp_path / "chatty.py", tmp_path / "calls"
    rewards.write_text(
        "import os, signal, sys\nfrom pathlib import Path\n"
        f"calls = Path({str(calls)!r})\n"
        "def chatty(completions, **kw):\n"
        "    n = int(calls.read_text()) + 1 if calls.exists() else 1\n"
        "    calls.write_text(str(n))\n"
        "    print(f'reward says hi {n}')\n"
        "    sys.stderr.write(f'note {n} without newline;')\n"
        "    if n == 2:  # its worker killed mid-call; a new worker serves call 3\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return [float(len(c) % 2) for c in completions]\n"
    )
    # no timeout: the kill comes from the call itself, not from a deadline that a loaded
    # machine could miss for the calls that return (under load every call once timed out)
    argv = args(
        tmp_path,
        "chatty",
        "train.steps=3",
        "rollout.reward_timeout_s=null",
        f"rewards=[{{name: '{rewards}:chatty'}}]",
    )
    plain = {k: v for k, v in env().items() if k != "PYTHONUNBUFFERED"}  # files: block-buffered
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.run(
            [sys.executable, "-m", "replayrl", "train", *argv],
            env=plain,
            stdout=o,
            stderr=e,
            timeout=240,
        )
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    assert calls.read_text() == "3"  # one call a step
    # whole lines at once, even from the call that hung; none repeated by a fork
    for n in (1, 2, 3):
        assert stdout.count(f"reward says hi {n}\n") == 1, stdout[-3000:]
    # flushed after each call: call 1's partial line survives the kill of its worker
    # (call 2's, unfinished when it was killed, is lost)
    assert stderr.count("note 1 without newline;") == 1, stderr[-3000:]
    assert stderr.count("note 3 without newline;") == 1, stderr[-3000:]
    assert stdout.count("run folder:") == 1  # the trainer's lines: once each too


HIGH_FD_SCRIPT = """
import os, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the pipes come after
from replayrl.rollout.rewards import WeightedReward, score
ok = WeightedReward("len", lambda completions, **_: [float(len(c)) for c in completions])
slow = WeightedReward("slow", lambda completions, **_: time.sleep(60))
res = score([ok], ["p", "q"], ["abc", "d"], [{}, {}], timeout_s=60, isolation="process")
assert ok.worker is not None and min(ok.worker.requests, ok.worker.replies) >= 1024
print("ok", res.rewards, res.reasons)
res = score([slow], ["p"], ["abc"], [{}], timeout_s=0.3, isolation="process")
print("slow", res.rewards, res.reasons)
"""


def test_reward_call_works_with_pipe_fds_above_1023(tmp_path: Path):  # I7
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048:
        pytest.skip("the hard limit on open files is under 2048")
    proc = subprocess.run(
        [sys.executable, "-c", HIGH_FD_SCRIPT],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # select(): "filedescriptor out of range"
    assert "ok [3.0, 1.0] {}" in proc.stdout
    assert "slow [None] {'timeout': 1}" in proc.stdout


def gone(pid: int) -> bool:
    """Ended (reaped, or a zombie no one has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_reward_server_killed_from_outside_is_forked_again():  # I8
    wr = WeightedReward("len", lambda completions, **_: [float(len(c)) for c in completions])
    assert score([wr], ["p"], ["ab"], [{}], isolation="process").rewards == [2.0]
    assert wr.worker is not None and wr.worker.pid is not None
    server, worker = wr.worker.server, wr.worker.pid
    first = server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)  # the OOM killer, say
    deadline = time.monotonic() + 30
    while not gone(worker):  # it dies with its server
        assert time.monotonic() < deadline
        time.sleep(0.01)
    res = score([wr], ["p"], ["ab"], [{}], isolation="process")
    assert res.reasons == {"worker_died": 1}
    assert "ended (its exit status is unknown)" in str(res.first_error)
    assert score([wr], ["p"], ["abc"], [{}], isolation="process").rewards == [3.0]
    assert server.starts == 2 and server.pid not in (None, first) and gone(first)


# -- async-local, Ray ---------------------------------------------------------------------------


def test_async_reward_failure_keeps_its_type_and_message(tmp_path: Path, capsys):  # A1
    rewards = tmp_path / "bad.py"
    rewards.write_text("def boom(completions, **kw):\n    raise KeyError('answer_col')\n")
    argv = args(
        tmp_path,
        "async",
        "runtime=async-local",
        "train.batch_size=8",
        "train.steps=6",
        f"rewards=[{{name: '{rewards}:boom'}}]",
    )
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2  # as in sync
    assert line.startswith(
        f"error: reward function '{rewards}:boom' failed on every call for 3 steps"
    ), line
    assert "first error: KeyError: 'answer_col' [error]" in line
    assert "generator worker" not in line and "restarts" not in line


def test_async_pool_raises_the_workers_reward_failure(tmp_path: Path):  # A1 (unit)
    from types import SimpleNamespace

    from replayrl.run.distributed.local import LocalGeneratorPool

    pool = LocalGeneratorPool.__new__(LocalGeneratorPool)
    pool.spool = tmp_path
    slot = SimpleNamespace(worker_id=0, incarnation=2)
    fatal = {"name": "f.py:g", "first_error": "KeyError: 'x' [error]", "steps": 3}
    (tmp_path / "fatal-w000-i02").write_text(json.dumps(fatal))
    with pytest.raises(RewardFunctionFailed) as info:
        pool._raise_fatal(slot)
    assert (info.value.name, info.value.steps) == ("f.py:g", 3)


def test_sigterm_to_a_ray_driver_exits_143(tmp_path: Path, capsys, monkeypatch):  # Y1
    """The Ray driver through the CLI with a stand-in for `ray` (a real cluster does not fit
    a test here): the stop asked for by SIGTERM ends with 143, like sync and async-local."""
    from replayrl.run.distributed import ray_runtime
    from test_async_runtime import _FakeRay

    class _TermRay(_FakeRay):
        def _poll(self) -> bool:
            self.polls += 1
            if self.polls == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return self.stop_requested or self.polls >= 50

    fake = _TermRay()
    monkeypatch.setattr(ray_runtime, "_ray", lambda: fake)
    argv = args(tmp_path, "ray", "runtime=ray", "train.batch_size=8", "ray.num_cpus=2")
    code, out, err = cli(["train", *argv], capsys)
    assert code == 143, err
    assert fake.stop_requested and "interrupted at step 3 (SIGTERM)" in out
    assert "interrupted (SIGTERM)" in err


# -- checkpoints written before content hashes; GAE ------------------------------------------


@pytest.mark.parametrize(
    ("file", "offset"),
    [
        ("state.safetensors", 3),  # C8: the header length
        ("policy/model.safetensors", 20),  # C8: inside the header's JSON
        ("state.json", 0),  # C8: the state's JSON
    ],
)
def test_damaged_checkpoint_without_hashes_falls_back(
    base_run: Path, tmp_path: Path, capsys, file: str, offset: int
):
    run = copy_run(base_run, tmp_path)
    for ckpt in (run / "checkpoints").glob("step_*"):  # as written before content hashes
        manifest = json.loads((ckpt / "manifest.json").read_text())
        del manifest["sha256"]
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
    last = run / "checkpoints/step_000004"
    _flip_byte(last / file, offset)
    code, out, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    assert f"skipping checkpoint {last}: damaged file {file}" in out
    assert "no SHA-256 in this older manifest" in out
    assert "resumed from" in out and "step_000002" in out


def test_zero_gradient_check_covers_gae(tmp_path: Path, capsys):  # S8
    rewards = tmp_path / "parity.py"
    rewards.write_text(
        "def parity(completions, **kw):\n"
        "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
    )
    reward = f"rewards=[{{name: '{rewards}:parity'}}]"
    argv = args(
        tmp_path, "gae", "algorithm.advantage=gae", "train.lr=1e6", "train.steps=30", reward
    )
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2 and "nothing was trained for 3 steps in a row" in line
    assert "gradient was exactly 0 although the batch's advantages were not" in line
    steps = [r["step"] for r in read_metrics(tmp_path / "gae" / "metrics.jsonl") if r["step"]]
    assert max(steps) < 30
