"""Atomic file writes and library quieting, shared by every module that writes run files.

A reader (or a resumed run) sees the old file or the new one, never a half-written one: the
data goes to a temporary file in the same folder, is flushed to disk, then renamed over.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, data: Any, indent: int | None = 2) -> Path:
    """JSON (non-JSON values such as paths written as text)."""
    return atomic_write_text(path, json.dumps(data, indent=indent, default=str))


def atomic_write_with(
    path: str | Path, write: Callable[[Path], object], fsync: bool = True
) -> Path:
    """`write(tmp)` fills a temporary file next to `path` (e.g. torch.save), then it is
    fsynced (unless `fsync=False`: survives a killed process, not a power cut) and renamed
    over `path`; on any error the temporary file is removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def quiet_transformers() -> None:
    """No per-save "Writing model shards" progress bars from transformers
    (they drown the loop's own output); idempotent."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
