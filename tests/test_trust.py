"""Signed run records, through the CLI: a run folder this user started resumes its own reward
code with `--resume` alone; a folder from another user (another key), an edited config.yaml,
an edited or forged record, a changed reward file or a missing key runs no code without
consent, each refused with its reason; `replayrl trust` signs a received folder.

Every run signs with the per-session key the conftest sets in REPLAYRL_TRUST_KEY; "another
user" is another key file. The reward file touches `<file>.ran` when it is imported, so each
test sees whether the folder's code ran at all.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from replayrl.run.records.run_record import RECORD
from replayrl.run.start import resume
from replayrl.storage.checkpoint import latest_checkpoint, load_state, manifest_value
from replayrl.storage.signing import (
    KEY_ENV,
    TrustKeyError,
    load_or_create_key,
    read_key,
    read_signed,
    sign,
    signature_matches,
    write_signed,
)
from test_faults import cli, one_error_line
from test_faults_reliability import args, copy_run, env, records, start, wait_for_step

PARITY = (
    "from pathlib import Path\n"
    "Path(__file__).with_suffix('.ran').touch()  # importing this file is running its code\n"
    "import time\n"
    "def parity(completions, **kw):\n"
    "    time.sleep({s})\n"
    "    return [float(sum(map(ord, c)) % 2) for c in completions]\n"
)


def reward_file(folder: Path, seconds: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "parity.py"
    path.write_text(PARITY.format(s=seconds))
    return path


def rewards_arg(path: Path) -> str:
    return f"rewards=[{{name: '{path}:parity'}}]"


def ran(reward: Path) -> Path:
    return reward.with_suffix(".ran")


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished 2-step run with a file reward, signed with this session's key."""
    root = tmp_path_factory.mktemp("signed")
    reward = reward_file(root / "code")
    from replayrl.cli.main import main

    assert main(["train", *args(root, "signed", "train.steps=2", rewards_arg(reward))]) == 0
    return root / "signed", reward


@pytest.fixture
def own(signed_run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the signed run (same user: it verifies) and its reward file, not yet run."""
    run, reward = signed_run
    ran(reward).unlink(missing_ok=True)
    return copy_run(run, tmp_path), reward


def other_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Act as another user: another key, made on first use as a run would make it."""
    path = tmp_path / "other-user" / "trust-key"
    monkeypatch.setenv(KEY_ENV, str(path))
    load_or_create_key(path)
    return path


def replayrl(argv: list[str]) -> tuple[int, str, str]:
    """The CLI in its own process: a reward file imported by an earlier run in this process
    would be cached, and the `.ran` marker could not tell whether its code ran again."""
    proc = subprocess.run(
        [sys.executable, "-m", "replayrl.cli.main", *argv],
        env=env(),  # REPLAYRL_TRUST_KEY as the test set it
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout, proc.stderr


def refused(argv: list[str], reward: Path) -> str:
    code, _, err = replayrl(argv)
    line = one_error_line(err)
    assert code == 2, err
    assert not ran(reward).exists()  # nothing of the folder's code was imported
    return line


# -- this user's own folder ---------------------------------------------------------------------


def test_own_folder_resumes_after_sigterm_without_a_flag(tmp_path: Path, capsys):
    """The scheduler's requeue: `replayrl train --resume RUN`, no --trust-run-code."""
    steps = 8
    reward = reward_file(tmp_path / "code", seconds=0.25)  # a signal lands mid-run
    proc = start(args(tmp_path, "preempted", f"train.steps={steps}", rewards_arg(reward)))
    run = tmp_path / "preempted"
    try:
        wait_for_step(run, proc, 2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    at = load_state(ckpt)["counters"]["step"]
    assert at < steps
    # the checkpoint carries the signature of the record it was written under
    record, signature = read_signed(run / RECORD)
    assert manifest_value(ckpt, "run_record_hmac") == signature
    assert record["rewards"] == [
        {"ref": f"{reward}:parity", "file": str(reward), "sha256": record["rewards"][0]["sha256"]}
    ]
    ran(reward).unlink()
    code, out, err = replayrl(["train", "--resume", str(run)])
    assert code == 0, err
    assert f"{run} is signed with your key" in out and "warning" not in out + err
    assert ran(reward).exists()  # its own reward code ran
    assert sorted(records(run)) == list(range(1, steps + 1))
    code, out, _ = cli(["trust", "--check", str(run)], capsys)
    assert code == 0 and out.startswith("trusted:")


@pytest.mark.slow
def test_own_folder_resumes_in_async_local(tmp_path: Path, capsys):
    reward = reward_file(tmp_path / "code")
    extra = ["runtime=async-local", "train.batch_size=8", "train.steps=2", rewards_arg(reward)]
    code, _, err = replayrl(["train", *args(tmp_path, "async", *extra)])
    assert code == 0, err
    ran(reward).unlink()
    run = tmp_path / "async"
    code, out, err = replayrl(["train", "--resume", str(run), "train.steps=3"])
    assert code == 0, err
    assert f"{run} is signed with your key" in out and ran(reward).exists()
    assert load_state(latest_checkpoint(run))["counters"]["step"] == 3


@pytest.mark.ray
def test_own_folder_resumes_in_ray(tmp_path: Path):
    reward = reward_file(tmp_path / "code")
    ray = ["runtime=ray", "ray.num_cpus=2", "ray.generator_num_cpus=0.5"]
    extra = [*ray, "ray.learner_num_cpus=0.5", "train.batch_size=8", "train.steps=2"]
    code, _, err = replayrl(["train", *args(tmp_path, "ray", *extra, rewards_arg(reward))])
    assert code == 0, err[-3000:]
    ran(reward).unlink()
    run = tmp_path / "ray"
    code, out, err = replayrl(["train", "--resume", str(run), "train.steps=3"])
    assert code == 0, err[-3000:]
    assert f"{run} is signed with your key" in out and ran(reward).exists()
    assert load_state(latest_checkpoint(run))["counters"]["step"] == 3


# -- what is refused, and why -------------------------------------------------------------------


def test_another_users_folder_runs_no_code_until_trusted(
    own: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch
):
    run, reward = own
    other_user(monkeypatch, tmp_path)
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert f"names reward code ({reward}:parity)" in line
    assert "does not verify with your key" in line and "--trust-run-code" in line
    code, out, _ = cli(["trust", "--check", str(run)], capsys)
    assert code == 1 and "not trusted: the signature of run-record.json does not verify" in out
    assert f"{reward}:parity  sha256 " in out  # what it would run
    # no terminal to confirm on (pytest's stdin): nothing is signed without --yes
    code, _, err = cli(["trust", str(run)], capsys)
    assert code == 2 and "pass --yes" in one_error_line(err)
    assert cli(["trust", "--check", str(run)], capsys)[0] == 1
    code, out, err = cli(["trust", "--yes", str(run)], capsys)
    assert code == 0, err
    assert f"{reward}:parity  sha256 " in out and "signed" in out
    assert not ran(reward).exists()  # signing shows the code, never runs it
    code, out, err = replayrl(["train", "--resume", str(run), "train.steps=3"])
    assert code == 0, err
    assert "signed with your key" in out and ran(reward).exists()


def test_edited_config_yaml_is_refused(own: tuple[Path, Path], capsys):
    run, reward = own
    cfg = run / "config.yaml"
    text = cfg.read_text()
    assert "num_prompts: 8" in text
    cfg.write_text(text.replace("num_prompts: 8", "num_prompts: 9"))  # not even code
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert "config.yaml was edited since the run signed it" in line


def test_edited_or_forged_record_is_refused(own: tuple[Path, Path], tmp_path: Path, capsys):
    run, reward = own
    record, signature = read_signed(run / RECORD)
    elsewhere = reward_file(tmp_path / "elsewhere")
    # edited: the record names other code, the signature is the original one
    edited = json.loads(json.dumps(record))
    edited["rewards"][0]["ref"] = f"{elsewhere}:parity"
    (run / RECORD).write_text(json.dumps({"record": edited, "hmac_sha256": signature}))
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert "does not verify with your key" in line and "the record was edited" in line
    # forged: a well-formed record signed with a key that is not this user's
    forged = write_signed(run / RECORD, record, b"not the user's key" * 4)
    assert forged != signature
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert "does not verify with your key" in line
    assert not ran(elsewhere).exists()
    # a record deleted: refused as an unsigned folder
    (run / RECORD).unlink()
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert "no signed record (run-record.json)" in line


def test_changed_reward_file_is_refused_naming_it(tmp_path: Path, capsys):
    reward = reward_file(tmp_path / "code")  # this test's own file, changed below
    run = tmp_path / "run"
    code, _, err = cli(
        ["train", *args(tmp_path, "run", "train.steps=2", rewards_arg(reward))], capsys
    )
    assert code == 0, err
    reward.write_text(reward.read_text() + "# edited after the start\n")
    ran(reward).unlink()
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert f"reward file {reward} changed since the run started" in line
    assert "--trust-run-code" in line
    # with consent it runs as it is now (and the record is signed again with the new file)
    argv = ["train", "--resume", str(run), "train.steps=3", "--trust-run-code"]
    code, out, err = replayrl(argv)
    assert code == 0, err
    assert f"warning: reward file {reward} changed since the run started" in out
    assert ran(reward).exists()
    code, out, err = replayrl(["train", "--resume", str(run), "train.steps=4"])
    assert code == 0 and "signed with your key" in out, err


def test_missing_key_is_refused(own: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch):
    run, reward = own
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "nowhere" / "trust-key"))
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert f"no trust key at {tmp_path / 'nowhere' / 'trust-key'}" in line
    assert not (tmp_path / "nowhere").exists()  # checking never creates a key


def test_key_inside_the_run_folder_vouches_for_nothing(own: tuple[Path, Path], capsys, monkeypatch):
    run, reward = own
    monkeypatch.setenv(KEY_ENV, str(run / "trust-key"))  # would travel with a copy
    line = refused(["train", "--resume", str(run), "train.steps=3"], reward)
    assert "lies inside the run folder" in line


def test_python_caller_without_a_decision_is_refused_a_changed_file(
    own: tuple[Path, Path], tmp_path: Path, monkeypatch
):
    """Resume from Python (no --trust-run-code decided) is consent to the folder's code, not
    to a reward file changed since the start (origin.json's hash)."""
    run, reward = own
    other_user(monkeypatch, tmp_path)
    origin = json.loads((run / "origin.json").read_text())
    origin["reward_files"][str(reward)] = "0" * 64
    (run / "origin.json").write_text(json.dumps(origin))
    with pytest.raises(Exception, match=f"reward file {reward} changed since the run started"):
        resume(run, ["train.steps=3"])
    assert not ran(reward).exists()


# -- the key and the signature ------------------------------------------------------------------


def test_key_is_created_once_private_and_shared_by_concurrent_starts(tmp_path: Path):
    path = tmp_path / "config" / "replayrl" / "trust-key"
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(load_or_create_key(path)))]
    threads += [threading.Thread(target=lambda: keys.append(load_or_create_key(path)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["trust-key"]  # no temp file left
    assert load_or_create_key(path) == keys[0] == read_key(path)


def test_key_location_follows_xdg_and_the_override(tmp_path: Path, monkeypatch):
    from replayrl.storage.signing import key_path

    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert key_path() == tmp_path / "xdg" / "replayrl" / "trust-key"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert key_path() == tmp_path / "home" / ".config" / "replayrl" / "trust-key"
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "cluster-key"))
    assert key_path() == tmp_path / "cluster-key"


def test_short_key_is_refused(tmp_path: Path):
    path = tmp_path / "trust-key"
    path.write_text("short\n")
    with pytest.raises(TrustKeyError, match="too short"):
        read_key(path)


def test_signature_is_hmac_sha256_of_the_canonical_record():
    import hashlib
    import hmac

    key = b"k" * 64
    record = {"b": [1, 2.5, None], "a": "x"}
    expected = hmac.new(
        key, b'replayrl signed run record v1\n{"a":"x","b":[1,2.5,null]}', hashlib.sha256
    ).hexdigest()
    assert sign(record, key) == expected
    assert signature_matches({"a": "x", "b": [1, 2.5, None]}, expected, key)  # key order free
    assert not signature_matches({"a": "x", "b": [1, 2.5, 0]}, expected, key)
    assert not signature_matches(record, expected, b"K" * 64)
    flipped = ("1" if expected[0] == "0" else "0") + expected[1:]
    assert not signature_matches(record, flipped, key)


def test_tests_never_touch_the_real_home():
    """The conftest points every run of the suite (and its subprocesses) at a temp key."""
    assert KEY_ENV in os.environ
    assert not Path(os.environ[KEY_ENV]).resolve().is_relative_to(Path.home().resolve())
