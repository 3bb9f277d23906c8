"""Checkpoints: layout, `latest` pointer, retention, RNG state round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from replayrl.storage.checkpoint import (
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


def test_safe_state_round_trips_plain_state_without_pickle():
    import math

    import pytest

    from replayrl.storage.safe_state import (
        StateFormatError,
        dumps,
        dumps_single,
        loads,
        loads_single,
    )

    x = torch.arange(6.0)
    state = {
        "tuple": (1, 2.5, None, "s", True),
        0: {"view": x[2:4], "whole": x, "empty": torch.zeros(0, dtype=torch.long)},
        "nan": float("nan"),
        "inf": float("-inf"),
        "big": 2**80,
        "np_rng": np.random.get_state(),
        "pcg": np.random.default_rng(1).bit_generator.state,
        "__tensor__": "not a marker",
    }
    for back in (loads(*dumps(state)), loads_single(dumps_single(state))):
        assert back["tuple"] == state["tuple"] and back["big"] == 2**80
        assert torch.equal(back[0]["view"], x[2:4]) and torch.equal(back[0]["whole"], x)
        assert back[0]["empty"].dtype == torch.long and back[0]["empty"].numel() == 0
        assert math.isnan(back["nan"]) and back["inf"] == float("-inf")
        assert back["__tensor__"] == "not a marker"
        np.random.set_state(back["np_rng"])
        a = np.random.rand()
        np.random.set_state(state["np_rng"])
        assert np.random.rand() == a
        g = np.random.default_rng()
        g.bit_generator.state = back["pcg"]
        assert g.random() == np.random.default_rng(1).random()
    with pytest.raises(TypeError, match=r"state\.obj: a object cannot be saved"):
        dumps({"obj": object()})
    text, blob = dumps({"a": np.zeros(2)})
    evil = text.replace(b'"<f8"', b'"|O"')
    with pytest.raises(StateFormatError, match="not plain numbers"):
        loads(evil, blob)


def test_checkpoint_keeps_and_restores_every_cuda_devices_rng(tmp_path: Path, monkeypatch):
    """On a GPU the CUDA generators (one per device) are saved and restored, through the
    no-pickle state files; stand-ins for two devices record what is set."""
    from replayrl.storage.safe_state import load_state_files, save_state

    devices = [torch.arange(8, dtype=torch.uint8), torch.arange(8, 16, dtype=torch.uint8)]
    restored: dict[int, torch.Tensor] = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [d.clone() for d in devices])
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s, device: restored.__setitem__(device, s)
    )
    save_state(tmp_path, "state", {"rng": rng_state()})
    set_rng_state(load_state_files(tmp_path, "state")["rng"])
    assert sorted(restored) == [0, 1]
    assert all(torch.equal(restored[i], devices[i]) for i in (0, 1))
