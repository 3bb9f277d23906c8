"""A per-user secret and HMAC-SHA256 signatures over JSON records (as Jupyter signs notebooks).

The key is created on first use, mode 0600, in the user's config folder
(`$XDG_CONFIG_HOME/replayrl/trust-key`, else `~/.config/replayrl/trust-key`), outside every
run folder, so a copied or received folder never carries it. `REPLAYRL_TRUST_KEY` names
another file (clusters whose home folders are shared between users or read-only).

A signature is HMAC-SHA256 over the record's canonical JSON (sorted keys, no spaces), so
any edit of the record, or a key other than the signer's, makes it fail to verify.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from replayrl.storage.io import atomic_write_text

KEY_ENV = "REPLAYRL_TRUST_KEY"
# binds a signature to this use: a MAC made by the same key for another purpose never verifies
DOMAIN = b"replayrl signed run record v1\n"
MIN_KEY_CHARS = 32
MAX_RECORD_BYTES = 10_000_000


class TrustKeyError(Exception):
    """The user's trust key is missing, unreadable or unusable (the message says which)."""


class RecordError(Exception):
    """A signed record that cannot be read (missing, malformed; the message says which)."""


def key_path() -> Path:
    """Where this user's key lives: $REPLAYRL_TRUST_KEY, else the user's config folder."""
    env = os.environ.get(KEY_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "replayrl" / "trust-key"


def read_key(path: Path | None = None) -> bytes:
    """The key's bytes; TrustKeyError (never creates one: a new key verifies nothing)."""
    path = key_path() if path is None else path
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise TrustKeyError(
            f"no trust key at {path} (written by the first run this user starts; "
            f"${KEY_ENV} names another file)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrustKeyError(f"trust key {path} cannot be read ({exc})") from None
    if len(text) < MIN_KEY_CHARS:
        raise TrustKeyError(f"trust key {path} is too short (under {MIN_KEY_CHARS} characters)")
    return text.encode()


def load_or_create_key(path: Path | None = None) -> bytes:
    """The key, created (256 random bits, mode 0600, its folder 0700) if there is none yet.

    Created under a temporary name and hard-linked into place, so two runs starting at once
    agree on one key and neither ever reads a half-written file."""
    path = key_path() if path is None else path
    if path.exists():
        return read_key(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".trust-key.", dir=path.parent)  # mode 0600
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(name, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        finally:
            os.unlink(name)
    except OSError as exc:
        raise TrustKeyError(f"could not create trust key {path} ({exc})") from None
    return read_key(path)


def canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(record: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) of the record's canonical JSON."""
    return hmac.new(key, DOMAIN + canonical(record), hashlib.sha256).hexdigest()


def signature_matches(record: dict[str, Any], signature: str, key: bytes) -> bool:
    """Constant-time comparison, so timing says nothing about how much of a forgery matched."""
    return hmac.compare_digest(sign(record, key), signature)


def write_signed(path: Path, record: dict[str, Any], key: bytes) -> str:
    """Write `{"record": ..., "hmac_sha256": ...}` atomically; returns the signature."""
    signature = sign(record, key)
    atomic_write_text(path, json.dumps({"record": record, "hmac_sha256": signature}, indent=1))
    return signature


def read_signed(path: Path) -> tuple[dict[str, Any], str]:
    """(record, signature) of a file `write_signed` wrote; RecordError saying what is wrong."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise RecordError(f"{path} is larger than {MAX_RECORD_BYTES} bytes")
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"no signed record ({path.name})") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise RecordError(f"{path.name} cannot be read ({type(exc).__name__})") from None
    record = data.get("record") if isinstance(data, dict) else None
    signature = data.get("hmac_sha256") if isinstance(data, dict) else None
    if not isinstance(record, dict) or not isinstance(signature, str):
        raise RecordError(f"{path.name} is not a signed record (no record or hmac_sha256)")
    return record, signature


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
