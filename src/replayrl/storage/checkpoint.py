"""Atomic checkpoints that load without running code: HF-format policy + trainer state.

Layout: <run>/checkpoints/step_000010/{policy/, state.json, state.safetensors,
manifest.json}. The trainer state (optimizer, RNG, counters, buffer) is split by
`safe_state` into tensors (safetensors) and everything else (JSON): nothing is unpickled
on load, so resuming a run folder someone sent you cannot execute code.

Each checkpoint is built in a temp folder, its files fsynced, `manifest.json` (every file,
its size and its SHA-256, and the run's config) written last, and the folder renamed into
place; `latest` names the newest. Resume takes the newest checkpoint whose manifest matches
the files on disk, contents included (a same-size corruption of the weights is caught), and
says which newer ones it skipped and why. Pruning keeps the newest `keep_last` complete
checkpoints and never the damaged ones in their place; temp folders left by a killed write
are removed at the next start (`clean_leftovers`). Checkpoints of older
versions (a pickled `state.pt`) are refused with a message, never silently unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replayrl.storage.io import atomic_write_text
from replayrl.storage.safe_state import StateFormatError, load_state_files, save_state

MANIFEST = "manifest.json"
STEP_NAME = re.compile(r"step_\d{6,}")
_HASH_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (old format, damaged, missing)."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (disk full, file-size limit, ...); names the last good one."""


# what the storage layers raise for a failed write (disk full, RLIMIT_FSIZE, a vanished
# mount): OSError from Python's own writes, RuntimeError from torch, and SafetensorError
# (an Exception of its own, no OSError) from safetensors, which writes the policy's weights
WRITE_ERRORS: tuple[type[Exception], ...] = (OSError, RuntimeError, SafetensorError)


def rng_state() -> dict[str, Any]:
    """Every generator a run draws from: Python's, numpy's, torch's CPU one and the CUDA one
    of each device this process sees (dropout and sampling on a GPU draw from those). Before
    CUDA is initialised no CUDA number was drawn, so there is nothing to keep."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy_global": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    # JSON keeps tuples as tuples (safe_state), but be lenient with lists
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(tuple(state["numpy_global"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        # a resume that sees fewer devices restores those it has; one on CPU only restores none
        for device, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)


def _files(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of each file (read back right after the write, from the page cache)."""
    return {rel: _sha256(folder / rel) for rel in _files(folder)}


def _step_dirs(root: Path) -> list[Path]:
    """The checkpoint folders of `root`, oldest first: real folders named step_NNNNNN only
    (a symlink or a stray folder is never read, pruned or followed)."""
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if STEP_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    )


def clean_leftovers(run_dir: Path) -> list[Path]:
    """Remove the temp folders of checkpoint writes that were killed (`.step_*.tmp-*`,
    `.step_*.old-*`); call only while holding the run folder's lock."""
    root = run_dir / "checkpoints"
    if not root.is_dir() or root.is_symlink():
        return []
    gone = [
        p
        for p in root.iterdir()
        if re.fullmatch(r"\.step_\d+\.(tmp|old)-.+", p.name) and p.is_dir() and not p.is_symlink()
    ]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _prune(root: Path, keep_last: int, name: str) -> None:
    """Keep the newest `keep_last` complete checkpoints (the one just written among them);
    damaged ones never count towards `keep_last` and older damaged ones are removed."""
    complete = 0
    for old in reversed(_step_dirs(root)):
        if old.name > name:  # newer than the write (a resume fell back past it): keep
            continue
        if old.name == name or (complete < keep_last and check_checkpoint(old) is None):
            complete += 1
            continue
        shutil.rmtree(old, ignore_errors=True)


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
    config: dict[str, Any] | None = None,
    record_signature: str | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `step` atomically; `config`: the run's config (recorded in the
    manifest, so a resume checks its settings against the checkpoint's own record);
    `record_signature`: the HMAC of the run's signed record it was written under; `extra`:
    writes more files into the temp folder (sharded learners: every rank's DCP shards)
    before the manifest, which then lists and hashes them with the rest."""
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
        if extra is not None:
            extra(tmp)
        _fsync_tree(tmp)
        manifest: dict[str, Any] = {
            "format": 1,
            "step": step,
            "files": _files(tmp),
            "sha256": _hashes(tmp),
        }
        if config is not None:
            manifest["config"] = config
        if record_signature is not None:
            manifest["run_record_hmac"] = record_signature
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        if dest.exists():  # rewriting a step (a finished run resumed): keep it until replaced
            old = root / f".{name}.old-{os.getpid()}"
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        atomic_write_text(root / "latest", name)
    except WRITE_ERRORS as exc:
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
    _prune(root, keep_last, name)
    return dest


def check_checkpoint(path: Path, verify: bool = False) -> str | None:
    """None if `path` is a complete checkpoint, else why not (for the resume message).
    `verify`: also compare each file's SHA-256 with the manifest's (reads every byte)."""
    if (path / "state.pt").is_file() and not (path / MANIFEST).is_file():
        return "old pickle format (state.pt)"
    mpath = path / MANIFEST
    if not mpath.is_file():
        return f"incomplete: no {MANIFEST} (interrupted while writing)"
    try:
        manifest = json.loads(mpath.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return f"{MANIFEST} is unreadable ({type(exc).__name__})"
    for rel, size in files.items():
        p = path / rel
        if not p.is_file():
            return f"missing file {rel}"
        actual = p.stat().st_size
        if actual != size:
            return f"truncated file {rel} ({actual} of {size} bytes)"
    if verify:
        hashes = manifest.get("sha256") or {}
        for rel in files:
            digest = hashes.get(rel) if isinstance(hashes, dict) else None
            if digest is None:  # written before content hashes: can it be loaded at all?
                why = unloadable(path / rel)
                if why:
                    return f"damaged file {rel} ({why}; no SHA-256 in this older manifest)"
            elif _sha256(path / rel) != digest:
                return f"damaged file {rel} (its contents do not match the manifest's SHA-256)"
    return None


def unloadable(path: Path) -> str | None:
    """Why a checkpoint file whose manifest has no SHA-256 cannot be loaded (None: it can).

    A cheaper, weaker check than a hash: a safetensors file's header must parse and its
    tensors' byte ranges fill the file exactly; a JSON file must parse. A same-size change
    inside the tensor data is not caught (only a hash would catch it)."""
    if path.suffix == ".json":
        try:
            json.loads(path.read_bytes())
        except RecursionError:
            return "nested too deeply"
        except ValueError as exc:
            return f"not valid JSON: {exc}"
        return None
    if path.suffix != ".safetensors":
        return None
    return _safetensors_damage(path)


def _safetensors_damage(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > size - 8 or n > 100_000_000:
            return "safetensors header length out of range"
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError):
            return "safetensors header is not valid JSON"
    if not isinstance(header, dict):
        return "safetensors header is not a table"
    ends = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            return f"safetensors entry {name!r} has no byte range"
        ends.append(offsets[1])
    if max(ends, default=0) != size - 8 - n:
        return "safetensors byte ranges do not match the file size"
    return None


def manifest_value(path: Path, key: str) -> Any:
    """One entry of a checkpoint's manifest (None when absent or unreadable)."""
    try:
        if (path / MANIFEST).stat().st_size > 10_000_000:
            return None
        return json.loads((path / MANIFEST).read_text()).get(key)
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def manifest_config(path: Path) -> dict[str, Any] | None:
    """The run config a checkpoint recorded when it was written (None for older ones)."""
    cfg = manifest_value(path, "config")
    return cfg if isinstance(cfg, dict) else None


def find_checkpoints(
    run_dir: Path, verify: bool = False
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(newest complete checkpoint, [(newer checkpoint skipped, why), ...]); `verify`: check
    contents too (SHA-256), as a resume does."""
    root = run_dir / "checkpoints"
    skipped: list[tuple[Path, str]] = []
    for path in reversed(_step_dirs(root)):
        reason = check_checkpoint(path, verify=verify)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def latest_checkpoint(run_dir: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint; `log` is told about each newer one skipped.

    Raises CheckpointError when the newest checkpoint is in the old pickle format: falling
    back past it would silently lose progress, loading it would run pickle.
    """
    path, skipped = find_checkpoints(run_dir, verify=True)
    for bad, reason in skipped:
        if reason.startswith("old pickle format"):
            raise CheckpointError(_legacy_message(bad))
        if log is not None:
            log(f"warning: skipping checkpoint {bad}: {reason}")
    if skipped and path is not None and log is not None:
        log(f"resuming from the newest complete checkpoint instead: {path}")
    return path


def describe_missing(run_dir: Path) -> str:
    """Why there is nothing to resume under `run_dir` (for the error message); the reasons
    are a resume's (contents checked), so a checkpoint skipped as damaged is named as such."""
    _, skipped = find_checkpoints(run_dir, verify=True)
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
