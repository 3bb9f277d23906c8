"""What a test run added to the working tree: `git status` entries (untracked or modified
files, ignored ones excluded) present after the run and not before it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def snapshot(root: Path) -> set[str] | None:
    """`git status --porcelain` lines of the checkout at `root`; None when `root` is not a git
    checkout or git is missing (a source archive: nothing to check)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {line for line in out.stdout.splitlines() if line.strip()}


def added(before: set[str] | None, after: set[str] | None) -> list[str]:
    """Entries that appeared between the two snapshots (none when either is missing)."""
    if before is None or after is None:
        return []
    return sorted(after - before)
