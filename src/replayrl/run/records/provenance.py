"""Where a run's numbers came from: the code, the libraries, the machine and the weights it
started from, written into every run's summary.json (`provenance`).

Two runs are comparable in one table only when they ran the same code (`commit`, and no
uncommitted edits: `dirty`) on the same kind of machine (`machine_id`: CPU model, instruction
flags, torch's ATen kernel choice and the library versions) from the same warm start
(`warmstart_sha256`). Kernels differ between CPUs even in float32, so a warm start built or
trained on two machines scores differently from its first evaluation on.

Every field is best effort: outside a git checkout `commit` and `dirty` are None, a
platform without /proc/cpuinfo leaves `cpu_flags` empty. Nothing here fails a run.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors",)  # what a warm start's hash covers (never pickles)


def git_state(where: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding `where`; (None, None) when it is not one,
    or git is missing. Dirty: tracked files differ from the commit (untracked ones do not
    change what runs unless imported, and a results folder would make every run dirty)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return None, None
    return head, bool(status.strip())


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """CPU model and instruction flags (from the first processor in /proc/cpuinfo)."""
    model: str | None = None
    flags: list[str] = []
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:  # x86 / ARM
            flags = sorted(value.split())
    model = model or platform.processor() or platform.machine()
    return {"cpu_model": model, "cpu_flags": flags, "cpu_count": os.cpu_count()}


def torch_build() -> dict[str, Any]:
    """torch's version, its ATen CPU kernel level and the MKL / oneDNN it was built with."""
    import torch

    show = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([^\s]+)", show)
    onednn = re.search(r"(?:MKL-DNN|oneDNN) (v[\d.]+)", show)
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = None
    return {
        "torch": torch.__version__,
        "aten_cpu_capability": capability,
        "mkl": mkl.group(1) if mkl else None,
        "onednn": onednn.group(1) if onednn else None,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
    }


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def weights_sha256(folder: str | Path) -> str | None:
    """SHA-256 over a model folder's weight files (name and bytes, in name order); None when
    `folder` is not a local folder with weight files (a hub id, an in-memory model)."""
    path = Path(folder)
    if not path.is_dir():
        return None
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def machine_id(prov: dict[str, Any]) -> str:
    """A short id of what makes kernels differ: CPU model, flags, ATen level, library builds."""
    keys = ("cpu_model", "cpu_flags", "aten_cpu_capability", "torch", "mkl", "onednn")
    payload = repr([prov.get(k) for k in keys]).encode()
    return hashlib.sha256(payload).hexdigest()[:12]


def run_provenance(
    model_path: str, threads: int | None, precision: dict[str, Any] | None
) -> dict[str, Any]:
    """The `provenance` block of a run's summary.json (see the module docstring)."""
    commit, dirty = git_state(Path(__file__).resolve().parent)  # the code that runs
    prov: dict[str, Any] = {
        "commit": commit,
        "dirty": dirty,
        "replayrl": package_version("replayrl"),
        "transformers": package_version("transformers"),
        **torch_build(),
        **cpu_info(),
        "python": platform.python_version(),
        "threads": threads,
        "precision": precision,
        "warmstart_path": model_path,
        "warmstart_sha256": weights_sha256(model_path),
    }
    prov["machine_id"] = machine_id(prov)
    return prov
