"""Atomic writes: the old file or the new one, never half of one, and no temp files left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.storage.io import atomic_write_json, atomic_write_text, atomic_write_with


def test_atomic_writes_replace_the_file(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    atomic_write_json(p, {"x": 1, "path": tmp_path})  # non-JSON values written as text
    assert json.loads(p.read_text()) == {"x": 1, "path": str(tmp_path)}
    atomic_write_text(p, "second")
    assert p.read_text() == "second"
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "state.bin"
    atomic_write_text(p, "old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_with(p, half_then_fail)
    assert p.read_text() == "old"
    assert [q.name for q in tmp_path.iterdir()] == ["state.bin"]
