"""The session check that fails a test run which wrote into the working tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import worktree_guard


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_a_file_written_during_the_run_is_reported(tmp_path: Path) -> None:
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "tracked.txt").write_text("a\n")
    (tmp_path / ".gitignore").write_text("runs/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    (tmp_path / "already.txt").write_text("untracked before the run\n")
    before = worktree_guard.snapshot(tmp_path)
    (tmp_path / "eval_heldout.json").write_text("{}")  # what `eval` without --out did
    (tmp_path / "tracked.txt").write_text("b\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.json").write_text("{}")  # ignored: not reported
    new = worktree_guard.added(before, worktree_guard.snapshot(tmp_path))
    assert new == [" M tracked.txt", "?? eval_heldout.json"]


def test_outside_a_git_checkout_nothing_is_checked(tmp_path: Path) -> None:
    assert worktree_guard.snapshot(tmp_path / "nowhere") is None
    assert worktree_guard.added(None, {"?? x"}) == []
