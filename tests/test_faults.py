"""Fault injection through the CLI: every expected failure ends in a clear message or a
counted skip, never a traceback, and never loses a finished or resumable run.

Catalogue (each test names its case ids):
  F1 kill -9 mid-run, then resume            F2 Ctrl-C (SIGINT) mid-run, then resume
  F3 truncated file in the latest checkpoint F4 missing file in the latest checkpoint
  F5 every checkpoint damaged                F6 old pickle checkpoint (never unpickled)
  F7 half-written last metrics.jsonl line    F8 file-size limit (RLIMIT_FSIZE) mid-run
  F9 disk full while checkpointing           F10 refused override on resume
  F11 overwrite=true + bad model.path        F12 overwrite=true + bad dataset
  F13 hanging reward function                F14 reward returning text / NaN / wrong length
  F15 slow reward function that raises       F16 over-long prompts (test_run.py)
  F17 exhausted worker restarts (run_guard)  F18 damaged spool file
  F19 start interrupted while replacing a run
  B1 train.steps=true  B2 NaN/inf floats  B3 empty model folder  B4 non-UTF-8 dataset row
  H1 random overrides (hypothesis)           H2 random dataset rows (hypothesis)
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayrl.cli.main import main
from replayrl.config.schema import Config, ConfigError, load_config
from replayrl.errors import RunFailed
from replayrl.rollout.rewards import WeightedReward, score
from replayrl.rollout.tasks import task_from_config
from replayrl.run.loops.pool import Delivery
from replayrl.run.metrics import read_metrics
from replayrl.run.records.folder import new_run_folder, run_guard
from replayrl.run.start import train
from replayrl.storage.checkpoint import latest_checkpoint, load_state
from tiny import TINY_RUN

SRC = str(Path(__file__).resolve().parents[1] / "src")
BASE = [*TINY_RUN, "train.threads=1", "method.name=replay", "buffer.capacity=16"]


def args(run_root: Path, name: str, *extra: str) -> list[str]:
    return [*BASE, f"logging.run_dir={run_root}", f"logging.name={name}", *extra]


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the CLI in this process (cheap); an uncaught exception fails the test."""
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def steps_logged(run: Path) -> list[int]:
    return sorted(r["step"] for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run with complete checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("faults")
    cfg = load_config(None, args(root, "base", "train.steps=4", "checkpoint.every=2"))
    train(cfg, log=lambda _: None)
    assert latest_checkpoint(root / "base").name == "step_000004"
    assert (root / "base/checkpoints/step_000002").is_dir()
    return root / "base"


def copy_run(base: Path, tmp_path: Path, name: str = "run") -> Path:
    dest = tmp_path / name
    shutil.copytree(base, dest)
    return dest


# -- checkpoints: damage and fallback ------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "truncated file state.safetensors"),  # F3
        ("delete", "missing file policy/model.safetensors"),  # F4
    ],
)
def test_resume_falls_back_past_a_damaged_checkpoint(
    base_run: Path, tmp_path: Path, capsys, damage: str, reason: str
):
    run = copy_run(base_run, tmp_path)
    last = run / "checkpoints/step_000004"
    if damage == "truncate":
        data = (last / "state.safetensors").read_bytes()
        (last / "state.safetensors").write_bytes(data[: len(data) // 2])
    else:
        (last / "policy/model.safetensors").unlink()
    code, out, err = cli(["train", "--resume", str(run)], capsys)
    assert code == 0, err
    assert f"skipping checkpoint {last}: {reason}" in out
    assert "step_000002" in out and "resumed from" in out
    assert steps_logged(run) == [1, 2, 3, 4]  # steps 3, 4 redone, each logged once
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert latest_checkpoint(run).name == "step_000004"


def test_every_checkpoint_damaged_is_a_clear_error(base_run: Path, tmp_path: Path, capsys):  # F5
    run = copy_run(base_run, tmp_path)
    for ckpt in (run / "checkpoints").glob("step_*"):
        (ckpt / "state.json").unlink()
    code, _, err = cli(["train", "--resume", str(run)], capsys)
    line = one_error_line(err)
    assert code == 2 and "no complete checkpoint" in line
    assert "step_000004: missing file state.json" in line


class _Canary:
    """Unpickling this creates a file: proof that a loader ran pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_old_pickle_checkpoint_is_refused_not_loaded(base_run: Path, tmp_path: Path, capsys):  # F6
    run = copy_run(base_run, tmp_path)
    canary = tmp_path / "pickle_ran"
    for ckpt in (run / "checkpoints").glob("step_*"):
        for f in ("state.json", "state.safetensors", "manifest.json"):
            (ckpt / f).unlink()
        (ckpt / "state.pt").write_bytes(pickle.dumps({"x": _Canary(str(canary))}))
    code, _, err = cli(["train", "--resume", str(run)], capsys)
    line = one_error_line(err)
    assert code == 2 and "pickle" in line and "not loaded" in line
    with pytest.raises(ValueError, match="pickle"):
        load_state(run / "checkpoints/step_000004")
    assert not canary.exists()


def test_partial_last_metrics_line_is_dropped(base_run: Path, tmp_path: Path, capsys):  # F7
    run = copy_run(base_run, tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward/me')
    code, out, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    assert "dropped a partial last line" in out
    assert steps_logged(run) == [1, 2, 3, 4, 5]


def test_refused_resume_override_changes_nothing(base_run: Path, tmp_path: Path, capsys):  # F10
    run = copy_run(base_run, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = cli(["train", "--resume", str(run), "buffer.capacity=64"], capsys)
    line = one_error_line(err)
    assert code == 2 and "buffer.capacity" in line and "nothing was written" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    code, _, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err  # the plain resume still works
    assert "train.steps=5" not in (run / "config.yaml").read_text()  # yaml, not overrides
    assert load_config(run / "config.yaml").train.steps == 5


# -- destructive starts --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "model.path={tmp}/no_such_model",  # F11
        "task.name=dataset task.dataset.path={tmp}/missing.jsonl",  # F12
    ],
)
def test_failed_overwrite_keeps_the_old_run(base_run: Path, tmp_path: Path, capsys, bad: str):
    copy_run(base_run, tmp_path, "base")
    run = tmp_path / "base"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    extra = bad.format(tmp=tmp_path).split()
    argv = ["train", *args(tmp_path, "base", "logging.overwrite=true", *extra)]
    code, _, err = cli(argv, capsys)
    assert code == 2 and one_error_line(err)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob(".base.replaced-*"))


def test_interrupted_start_puts_the_old_run_back(tmp_path: Path):  # F19
    run = tmp_path / "r"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    (run / "config.yaml").write_text("train: {}\nlogging: {}\n")  # a run folder's config
    logs: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with new_run_folder(run, overwrite=True, log=logs.append):
            assert not (run / "summary.json").exists()  # the new run starts empty
            (run / "config.yaml").write_text("partial")
            raise KeyboardInterrupt
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "summary.json"]
    # a start killed (-9) half-way leaves the old run aside: the next start says where it is
    (tmp_path / ".r.replaced-123").mkdir()
    with new_run_folder(run, overwrite=True, log=logs.append):
        pass
    assert any(".r.replaced-123 holds a run moved aside" in line for line in logs)


# -- write errors --------------------------------------------------------------------------


def test_disk_full_while_checkpointing(base_run: Path, tmp_path: Path, capsys, monkeypatch):  # F9
    import replayrl.storage.checkpoint as ck

    run = copy_run(base_run, tmp_path)
    real = ck.save_state

    def full_disk(folder, name, state, fsync=True):
        real(folder, name, state, fsync)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "save_state", full_disk)
    code, _, err = cli(["train", "--resume", str(run), "train.steps=5"], capsys)
    line = one_error_line(err)
    assert code == 2 and "No space left" in line
    assert "last good checkpoint is" in line and "step_000004" in line
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(ck, "save_state", real)
    assert cli(["train", "--resume", str(run), "train.steps=5"], capsys)[0] == 0


def resume_under_file_size_limit(run: Path, limit: int, steps: int) -> subprocess.CompletedProcess:
    """`replayrl train --resume RUN train.steps=STEPS` in a process that may not write a file
    past `limit` bytes (RLIMIT_FSIZE: a write beyond it fails with EFBIG)."""

    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "replayrl", "train", "--resume", str(run), f"train.steps={steps}"],
        env=env(),
        capture_output=True,
        text=True,
        preexec_fn=set_limit,
        timeout=300,
    )


def test_file_size_limit_mid_run(base_run: Path, tmp_path: Path):  # F8
    run = copy_run(base_run, tmp_path)
    limit = 60_000  # the policy weights (~45 kB) fit, the trainer state (~90 kB) does not
    assert (run / "checkpoints/step_000004/state.safetensors").stat().st_size > limit
    proc = resume_under_file_size_limit(run, limit, 5)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert "could not write checkpoint" in line and "step_000004" in line
    assert latest_checkpoint(run).name == "step_000004"
    assert load_state(run / "checkpoints/step_000004")["step"] == 4


# -- signals -------------------------------------------------------------------------------


def _start(run_root: Path, name: str) -> subprocess.Popen:
    argv = args(run_root, name, "train.steps=400", "checkpoint.every=1")
    return subprocess.Popen(
        [sys.executable, "-m", "replayrl.cli.main", "train", *argv],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, step: int) -> None:
    """Until a checkpoint at `step` or later exists. Not `step` itself: `keep_last` prunes
    older checkpoints, so a poller descheduled under load may never see that one folder."""

    def reached() -> bool:
        names = (p.name for p in (run / "checkpoints").glob("step_*") if p.is_dir())
        return any(n[5:].isdigit() and int(n[5:]) >= step for n in names)

    deadline = time.monotonic() + 240
    while not reached():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_kill_9_mid_run_then_resume(tmp_path: Path, capsys):  # F1
    proc = _start(tmp_path, "killed")
    try:
        _wait_for_checkpoint(tmp_path / "killed", proc, 3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    run = tmp_path / "killed"
    done = latest_checkpoint(run)
    assert done is not None
    target = int(done.name.split("_")[1]) + 2
    code, out, err = cli(["train", "--resume", str(run), f"train.steps={target}"], capsys)
    assert code == 0, err
    assert steps_logged(run) == list(range(1, target + 1))


def test_ctrl_c_mid_run_then_resume(tmp_path: Path, capsys):  # F2
    proc = _start(tmp_path, "sigint")
    try:
        _wait_for_checkpoint(tmp_path / "sigint", proc, 2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    run = tmp_path / "sigint"
    stopped = load_state(latest_checkpoint(run))["counters"]["step"]
    code, _, err = cli(["train", "--resume", str(run), f"train.steps={stopped + 1}"], capsys)
    assert code == 0, err
    assert steps_logged(run) == list(range(1, stopped + 2))


def test_exhausted_restarts_name_the_last_good_checkpoint(base_run: Path):  # F17 (unit)
    with pytest.raises(RunFailed, match="worker 0 died.*last good checkpoint: .*step_000004"):
        with run_guard(base_run, log=lambda _: None):
            raise RunFailed("generator worker 0 died after 3 restarts")


def test_async_worker_dying_past_max_restarts(tmp_path: Path, capsys):  # F17 (end to end)
    rewards = tmp_path / "die.py"
    # generator workers score rollouts, the learner process never does: only workers die
    rewards.write_text("import os\ndef die(completions, **kw):\n    os._exit(3)\n")
    argv = args(
        tmp_path,
        "async",
        "runtime=async-local",
        "workers.max_restarts=0",
        "train.batch_size=8",
        "train.steps=3",
        # in the worker's own process (a reward worker process would only lose that call)
        "rollout.reward_isolation=thread",
        f"rewards=[{{name: '{rewards}:die'}}]",
    )
    code, _, err = cli(["train", *argv], capsys)
    line = one_error_line(err)
    assert code == 2 and "generator worker 0" in line and "max_restarts=0" in line
    assert "no complete checkpoint" in line  # it died before any checkpoint: says so


def test_damaged_spool_file_is_an_error_not_a_crash(tmp_path: Path):  # F18
    d = Delivery(0, 0, 1, 0, [], {}, 0, 0, 0, 0, None, 0.0, 0.0)
    d.save(tmp_path / "d")
    data = (tmp_path / "d").read_bytes()
    (tmp_path / "d").write_bytes(data[: len(data) - 5])
    with pytest.raises(ValueError, match="truncated"):
        Delivery.load(tmp_path / "d")


# -- reward functions ----------------------------------------------------------------------


def test_hanging_and_lying_reward_functions(tmp_path: Path, capsys):  # F13, F14
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "import time\n"
        "def hang(completions, **kw):\n"
        "    if len(completions) > 1:\n"  # batch calls hang; never retried per item
        "        time.sleep(3600)\n"
        "    return [1.0]\n"
        "def text(completions, **kw):\n"
        "    return ['1.0'] * len(completions)\n"
    )
    # the timeout only for the function that hangs: one that returns at once must not depend
    # on the machine's speed to beat it
    cases = (
        ("hang", "hang", "timeout", "0.5"),
        ("text", "text", "non_numeric", "null"),
    )
    for name, fn, reason, timeout in cases:
        argv = args(
            tmp_path,
            name,
            "train.steps=2",
            f"rewards=[{{name: '{rewards}:{fn}'}}]",
            f"rollout.reward_timeout_s={timeout}",
        )
        code, out, err = cli(["train", *argv], capsys)
        # every rollout dropped: nothing trained, so the run fails (even before
        # train.failure_patience steps) naming the first error, and writes no summary
        line = one_error_line(err)
        assert code == 2 and "nothing was trained in 2 step(s)" in line, err
        assert f"[{reason}]" in line
        assert not (tmp_path / name / "summary.json").exists()
        records = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["step"]]
        last = records[-1]
        assert last["rollouts_generated"] == 16 and last["rollouts/dropped_reward_error"] == 16
        assert last["rollouts/dropped_reward_timeout"] == (16 if reason == "timeout" else 0)
        if reason == "timeout":  # waited for the timeouts, and not as generation time
            assert all(r["time/reward_s"] >= 0.5 for r in records)
            parts = sum(
                r["time/generation_s"] + r["time/reward_s"] + r["time/training_s"] for r in records
            )
            assert parts <= last["wall_seconds"] + 1e-6


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (["1.0", "1.0"], "non_numeric"),
        ([float("nan"), 1.0], "non_finite"),
        ([float("inf"), 1.0], "non_finite"),
        ([1.0, 2.0, 3.0], "wrong_length"),
        ([b"1", 1.0], "non_numeric"),
        ([[1.0], 1.0], "non_numeric"),
    ],
)
def test_lying_reward_values_are_dropped_by_reason(values: list, reason: str):  # F14
    res = score([WeightedReward("f", lambda **_: values)], ["p", "q"], ["a", "b"], [{}, {}])
    assert res.reasons.get(reason, 0) >= 1 and res.errors >= 1
    ok = [r for r in res.rewards if r is not None]
    assert len(ok) == 2 - res.errors


def test_numbers_of_any_kind_are_rewards():
    import numpy as np
    import torch

    vals = [True, np.float32(0.5), torch.tensor(2.0), 3]
    res = score([WeightedReward("f", lambda **_: vals)], ["p"] * 4, ["a"] * 4, [{}] * 4)
    assert res.rewards == [1.0, 0.5, 2.0, 3.0] and res.errors == 0


def test_slow_raising_reward_is_not_retried_past_its_budget():  # F15
    calls = []

    def slow_fail(completions, **kw):
        calls.append(len(completions))
        time.sleep(0.2)
        raise RuntimeError("boom")

    res = score([WeightedReward("f", slow_fail)], ["p"] * 64, ["a"] * 64, [{}] * 64, timeout_s=0.5)
    assert res.errors == 64 and res.reasons["timeout"] + res.reasons["error"] == 64
    assert len(calls) <= 5  # one batch call + the retries that fit 0.5 s, not 64


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.steps=true", "train.steps: Value error, expected a number, not the boolean"),  # B1
        ("train.lr=.nan", "train.lr: Input should be a finite number"),  # B2
        ("kl.beta=.inf", "kl.beta: Input should be a finite number"),  # B2
    ],
)
def test_bad_numbers_are_config_errors(tmp_path: Path, capsys, override: str, message: str):
    code, _, err = cli(["train", *args(tmp_path, "x", override)], capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_empty_model_folder(tmp_path: Path, capsys):  # B3
    (tmp_path / "empty").mkdir()
    code, _, err = cli(["train", *args(tmp_path, "x", f"model.path={tmp_path / 'empty'}")], capsys)
    line = one_error_line(err)
    assert code == 2 and f"not a model folder: {tmp_path / 'empty'} has no config.json" in line


def test_non_utf8_dataset_row_is_skipped_and_counted(base_run: Path, tmp_path: Path, capsys):  # B4
    data = tmp_path / "d.jsonl"
    lines = [b'{"prompt": "%d+1=", "answer": "%d"}' % (i, i + 1) for i in range(20)]
    lines[5] = b'{"prompt": "\xff+1=", "answer": "1"}'
    data.write_bytes(b"\n".join(lines) + b"\n")
    model = base_run / "checkpoints/step_000004/policy"  # a model folder with a tokenizer
    argv = args(
        tmp_path,
        "ds",
        "task.name=dataset",
        f"task.dataset.path={data}",
        "task.eval_size=4",
        f"model.path={model}",
    )
    code, out, err = cli(["train", *argv, "train.steps=1"], capsys)
    assert code == 0, err
    assert "not_utf8=1" in out and f"first not_utf8 at {data}:6" in out


# -- property-based ------------------------------------------------------------------------

KEYS = [
    "train.steps",
    "train.lr",
    "train.batch_size",
    "train.threads",
    "buffer.capacity",
    "buffer.delta",
    "method.name",
    "rollout.temperature",
    "rollout.reward_timeout_s",
    "rollout.num_generations",
    "kl.beta",
    "eval.every",
    "logging.name",
    "logging.overwrite",
    "checkpoint.keep_last",
    "no.such_key",
]
YAML_VALUES = st.one_of(
    st.sampled_from(["true", "false", "null", ".nan", ".inf", "-.inf", "[]", "{}", "auto", ""]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=8),
)


def _numbers_ok(node: object) -> bool:
    if isinstance(node, dict):
        return all(_numbers_ok(v) for v in node.values())
    if isinstance(node, list):
        return all(_numbers_ok(v) for v in node)
    return not (isinstance(node, float) and node != node) and node not in (
        float("inf"),
        float("-inf"),
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), YAML_VALUES), max_size=4))
def test_random_overrides_give_a_config_or_a_config_error(pairs):  # H1
    overrides = [f"{k}={v}" for k, v in pairs]
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        assert str(exc).strip()
        return
    assert isinstance(cfg, Config)
    assert _numbers_ok(cfg.model_dump())
    for k, v in dict(pairs).items():  # the last override of a key wins
        if v in ("true", "false") and k != "logging.overwrite":
            pytest.fail(f"{k}={v} accepted")


ROW = st.one_of(
    st.fixed_dictionaries(
        {"prompt": st.text(max_size=6), "answer": st.one_of(st.text(max_size=3), st.integers())}
    ),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(),
    st.none(),
)
LINE = st.one_of(ROW.map(lambda r: json.dumps(r).encode()), st.binary(max_size=12))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(LINE, min_size=1, max_size=12))
def test_random_dataset_rows_are_loaded_or_skipped_and_counted(tmp_path: Path, lines):  # H2
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines))
    cfg = load_config(None, ["task.name=dataset", f"task.dataset.path={path}", "task.eval_size=1"])
    try:
        task = task_from_config(cfg.task)
    except ValueError as exc:  # no usable row (or only one): a message naming the file
        assert str(path) in str(exc)
        return
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    nonblank = [ln for ln in text.split("\n") if ln.strip()]
    kept = task.num_train + task.num_eval
    assert kept + sum(task.skipped.values()) == len(nonblank)  # every line kept or counted
