"""Checkpoints: layout, `latest` pointer, retention, RNG state round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from replayrl.checkpoint import (
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_save_layout_latest_and_retention(tmp_path: Path, tiny_model, char_tokenizer):
    for step in (1, 2, 3):
        path = save_checkpoint(
            tmp_path, step, tiny_model, char_tokenizer, {"marker": step}, keep_last=2
        )
        assert path == tmp_path / "checkpoints" / f"step_{step:06d}"
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_000002", "step_000003"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp folders left
    latest = latest_checkpoint(tmp_path)
    assert latest == root / "step_000003"
    state = load_state(latest)
    assert state["marker"] == 3
    assert state["step"] == 3
    assert {"python", "numpy_global", "torch"} <= set(state["rng"])
    assert (latest / "policy" / "config.json").is_file()
    assert (latest / "policy" / "tokenizer.json").is_file()


def test_latest_ignores_incomplete_checkpoints(tmp_path: Path):
    assert latest_checkpoint(tmp_path) is None  # no checkpoints folder
    root = tmp_path / "checkpoints"
    (root / "step_000005" / "policy").mkdir(parents=True)  # no state.pt: a partial write
    (root / "latest").write_text("step_000005\n")
    assert latest_checkpoint(tmp_path) is None


def test_rng_state_round_trip():
    state = rng_state()
    draws = (random.random(), float(np.random.rand()), float(torch.rand(())))
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == draws
