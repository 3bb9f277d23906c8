"""Signed run records: a run folder this user started resumes its own reward code unasked.

At a start (and after each resume) the run writes `run-record.json`: what it will execute
(each reward reference naming code, with its file's SHA-256), the SHA-256 of `config.yaml`,
the resolved config, the folder relative paths resolve against, and replayrl's version,
signed with HMAC-SHA256 under this user's key (`replayrl.storage.signing`). A resume verifies
it: a folder signed with this user's key runs the code its record names; a folder from
another user (another key), an edited record or config.yaml, a changed reward file or a
missing key are refused as an unsigned folder is, each with its reason. The model is
Jupyter's for notebooks: the signature says "I made this", not "this is safe".

Callers pass what they computed from the config (this module reads no config itself).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayrl.storage.signing import (
    RecordError,
    TrustKeyError,
    file_sha256,
    key_path,
    load_or_create_key,
    read_key,
    read_signed,
    signature_matches,
    write_signed,
)

RECORD = "run-record.json"
Log = Callable[[str], None]


@dataclass(frozen=True)
class Verdict:
    """Whether a run folder's record verifies with this user's key, and why not."""

    trusted: bool
    reason: str = ""  # why not (empty when trusted)
    changed_file: str | None = None  # a reward file whose contents differ from the record's
    rewards: list[dict[str, Any]] = field(default_factory=list)  # the signed references


def reward_refs(specs: list[str], file_of: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """Each code reference with its file and the file's SHA-256 (None: a module, or a file
    that does not exist)."""
    out = []
    for spec in specs:
        target = file_of(spec)
        digest = None
        if target is not None and Path(target).is_file():
            digest = file_sha256(Path(target))
        out.append({"ref": spec, "file": target, "sha256": digest})
    return out


def code_version() -> str:
    """replayrl's version and, from a git checkout, its commit (for the reader of a record)."""
    try:
        version = importlib.metadata.version("replayrl")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    # src/replayrl/run/records/run_record.py -> the checkout
    root = Path(__file__).resolve().parents[4]
    if not (root / ".git").exists():  # installed: not the commit of a repo it happens to sit in
        return version
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version} ({commit})" if commit else version


def _key_outside(run_dir: Path) -> Path:
    """The key's path; TrustKeyError when it lies inside the run folder (copied with it)."""
    path = key_path()
    if path.resolve().is_relative_to(run_dir.resolve()):
        raise TrustKeyError(
            f"trust key {path} lies inside the run folder {run_dir}: a key travels with a "
            "copied folder and would vouch for it; keep it outside every run folder"
        )
    return path


def sign_run_folder(
    run_dir: Path, config: dict[str, Any], cwd: str | None, rewards: list[dict[str, Any]]
) -> str:
    """Write the signed record of `run_dir` (config.yaml as it is on disk now); returns the
    signature. TrustKeyError when no key can be read or created."""
    key = load_or_create_key(_key_outside(run_dir))
    record = {
        "format": 1,
        "config_sha256": file_sha256(run_dir / "config.yaml"),
        "cwd": cwd,
        "rewards": rewards,
        "code_version": code_version(),
        "config": config,
    }
    return write_signed(run_dir / RECORD, record, key)


def sign_or_warn(
    run_dir: Path,
    config: dict[str, Any],
    cwd: str | None,
    rewards: list[dict[str, Any]],
    log: Log,
) -> None:
    """`sign_run_folder`; a key that cannot be made (a read-only home) does not stop the run:
    it says so, and drops a stale record (it no longer matches config.yaml)."""
    try:
        sign_run_folder(run_dir, config, cwd, rewards)
    except TrustKeyError as exc:
        (run_dir / RECORD).unlink(missing_ok=True)
        log(
            f"warning: run folder not signed ({exc}); a resume of its reward code will need "
            "--trust-run-code"
        )


def record_signature(run_dir: Path) -> str | None:
    """The signature of the folder's record as written (for checkpoint manifests); None when
    there is none. Not a verification."""
    try:
        return read_signed(run_dir / RECORD)[1]
    except RecordError:
        return None


def verify_run_folder(run_dir: Path, cwd: str | None, rewards: list[dict[str, Any]]) -> Verdict:
    """Trusted when the record verifies with this user's key, config.yaml and the start folder
    are the signed ones and every reference in `rewards` (what the resume would run, from
    `reward_refs`) is signed with the same file contents."""
    try:
        key = read_key(_key_outside(run_dir))
        record, signature = read_signed(run_dir / RECORD)
    except (TrustKeyError, RecordError) as exc:
        return Verdict(False, str(exc))
    if not signature_matches(record, signature, key):
        return Verdict(
            False,
            f"the signature of {RECORD} does not verify with your key ({key_path()}): the "
            "folder was signed by another user (another key), or the record was edited",
        )
    signed = [r for r in record.get("rewards") or [] if isinstance(r, dict)]
    try:
        config_now = file_sha256(run_dir / "config.yaml")
    except OSError as exc:
        return Verdict(False, f"config.yaml cannot be read ({exc})")
    if config_now != record.get("config_sha256"):
        return Verdict(False, "config.yaml was edited since the run signed it", rewards=signed)
    if cwd != record.get("cwd"):
        return Verdict(
            False, "origin.json (the start folder) was edited since the run signed it", None, signed
        )
    return _check_files(rewards, signed)


def _check_files(now: list[dict[str, Any]], signed: list[dict[str, Any]]) -> Verdict:
    by_ref = {r.get("ref"): r for r in signed}
    for ref in now:
        old = by_ref.get(ref["ref"])
        if old is None:
            return Verdict(False, f"reward {ref['ref']} is not in the signed record", None, signed)
        if ref["file"] is not None and ref["sha256"] is None:
            return Verdict(False, f"reward file {ref['file']} does not exist", None, signed)
        if ref["sha256"] != old.get("sha256"):
            return Verdict(
                False,
                f"reward file {ref['file']} changed since the run started (its SHA-256 differs "
                "from the run's signed record)",
                ref["file"],
                signed,
            )
    return Verdict(True, rewards=signed)
