"""Atomic checkpoints: HF-format policy + trainer state (optimizer, RNG, counters, buffer).

Layout: <run>/checkpoints/step_000010/{policy/, state.pt}; <run>/checkpoints/latest names
the newest complete one. Each checkpoint is built in a temp folder and renamed into place,
and `latest` is replaced atomically, so a crash mid-write never leaves a half checkpoint
that resume would pick up.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replayrl.io import atomic_write_text as _write_text_atomic


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy_global": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy_global"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep_last: int = 2,
) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    dest = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        model.save_pretrained(tmp / "policy")
        tokenizer.save_pretrained(tmp / "policy")
        torch.save({**state, "rng": rng_state(), "step": step}, tmp / "state.pt")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / "latest", name)
    kept = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in kept[:-keep_last]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt / "state.pt", weights_only=False)
