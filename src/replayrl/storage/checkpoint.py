"""Atomic checkpoints that load without running code: HF-format policy + trainer state.

Layout: <run>/checkpoints/step_000010/{policy/, state.json, state.safetensors,
manifest.json}. The trainer state (optimizer, RNG, counters, buffer) is split by
`safe_state` into tensors (safetensors) and everything else (JSON): nothing is unpickled
on load, so resuming a run folder someone sent you cannot execute code.

Each checkpoint is built in a temp folder, its files fsynced, `manifest.json` (every file
and its size) written last, and the folder renamed into place; `latest` names the newest.
Resume takes the newest checkpoint whose manifest matches the files on disk and says
which newer ones it skipped and why (a truncated or missing file). Checkpoints of older
versions (a pickled `state.pt`) are refused with a message, never silently unpickled.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replayrl.storage.io import atomic_write_text
from replayrl.storage.safe_state import StateFormatError, load_state_files, save_state

MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (old format, damaged, missing)."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (disk full, file-size limit, ...); names the last good one."""


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy_global": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    # JSON keeps tuples as tuples (safe_state), but be lenient with lists
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(tuple(state["numpy_global"]))
    torch.set_rng_state(state["torch"])


def _files(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep_last: int = 2,
) -> Path:
    root = run_dir / "checkpoints"
    name = f"step_{step:06d}"
    dest = root / name
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        model.save_pretrained(tmp / "policy")
        tokenizer.save_pretrained(tmp / "policy")
        save_state(tmp, "state", {**state, "rng": rng_state(), "step": step})
        _fsync_tree(tmp)
        manifest = {"format": 1, "step": step, "files": _files(tmp)}
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        if dest.exists():  # rewriting a step (a finished run resumed): keep it until replaced
            old = root / f".{name}.old-{os.getpid()}"
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        atomic_write_text(root / "latest", name)
    except (OSError, RuntimeError) as exc:
        # torch/safetensors report a failed write (disk full, RLIMIT_FSIZE) as RuntimeError
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        good, _ = find_checkpoints(run_dir)
        last = f"the last good checkpoint is {good}" if good else "no earlier checkpoint exists"
        raise CheckpointWriteError(
            f"could not write checkpoint {dest} ({type(exc).__name__}: {exc}); {last}"
        ) from exc
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    kept = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in kept[:-keep_last]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def check_checkpoint(path: Path) -> str | None:
    """None if `path` is a complete checkpoint, else why not (for the resume message)."""
    if (path / "state.pt").is_file() and not (path / MANIFEST).is_file():
        return "old pickle format (state.pt)"
    mpath = path / MANIFEST
    if not mpath.is_file():
        return f"incomplete: no {MANIFEST} (interrupted while writing)"
    try:
        manifest = json.loads(mpath.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    for rel, size in files.items():
        p = path / rel
        if not p.is_file():
            return f"missing file {rel}"
        actual = p.stat().st_size
        if actual != size:
            return f"truncated file {rel} ({actual} of {size} bytes)"
    return None


def find_checkpoints(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(newest complete checkpoint, [(newer checkpoint skipped, why), ...])."""
    root = run_dir / "checkpoints"
    skipped: list[tuple[Path, str]] = []
    if not root.is_dir():
        return None, skipped
    for path in sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True):
        reason = check_checkpoint(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def latest_checkpoint(run_dir: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint; `log` is told about each newer one skipped.

    Raises CheckpointError when the newest checkpoint is in the old pickle format: falling
    back past it would silently lose progress, loading it would run pickle.
    """
    path, skipped = find_checkpoints(run_dir)
    for bad, reason in skipped:
        if reason.startswith("old pickle format"):
            raise CheckpointError(_legacy_message(bad))
        if log is not None:
            log(f"warning: skipping checkpoint {bad}: {reason}")
    if skipped and path is not None and log is not None:
        log(f"resuming from the newest complete checkpoint instead: {path}")
    return path


def describe_missing(run_dir: Path) -> str:
    """Why there is nothing to resume under `run_dir` (for the error message)."""
    _, skipped = find_checkpoints(run_dir)
    if not skipped:
        return f"no complete checkpoint under {run_dir / 'checkpoints'} to resume"
    why = "; ".join(f"{p.name}: {r}" for p, r in skipped)
    return f"no complete checkpoint under {run_dir / 'checkpoints'} to resume ({why})"


def _legacy_message(path: Path) -> str:
    return (
        f"checkpoint {path} was written by an older replayrl as a pickle (state.pt); it is "
        "not loaded because unpickling a file can execute code. Start a new run (its policy/ "
        "folder is a plain model folder you can give as model.path)"
    )


def load_state(ckpt: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint: JSON + safetensors, never pickle."""
    if not (ckpt / "state.json").is_file() and (ckpt / "state.pt").is_file():
        raise CheckpointError(_legacy_message(ckpt))
    try:
        return load_state_files(ckpt, "state")
    except StateFormatError as exc:
        raise CheckpointError(f"checkpoint {ckpt} is damaged: {exc}") from None
