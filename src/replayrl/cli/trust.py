"""`replayrl trust RUN_DIR`: sign a run folder received from elsewhere after showing the
code it runs; `replayrl trust --check RUN_DIR`: whether a folder is trusted, and why not."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replayrl.config.schema import ConfigError
from replayrl.run.records.run_record import (
    RECORD,
    Verdict,
    record_signature,
    sign_run_folder,
    verify_run_folder,
)
from replayrl.storage.signing import TrustKeyError, key_path

# run.folder and storage.checkpoint (torch, transformers) load only when `trust` runs, so
# that `replayrl --help` stays fast


def add_trust(sub: Any) -> None:
    p = sub.add_parser(
        "trust",
        help="sign a run folder with your key (its reward code then runs at --resume), "
        "or --check whether it is trusted",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder")
    p.add_argument(
        "--check", action="store_true", help="sign nothing: say whether it is trusted (exit 0/1)"
    )
    p.add_argument("--yes", "-y", action="store_true", help="sign without asking")
    p.set_defaults(func=cmd_trust)


def _show_code(refs: list[dict[str, Any]], cwd: str | None) -> None:
    if not refs:
        print("  no reward code besides replayrl's own (a resume runs none from this folder)")
    for r in refs:
        if r["file"] is None:
            print(f"  {r['ref']}  (a module: runs whatever is installed under that name)")
        elif r["sha256"] is None:
            print(f"  {r['ref']}  (file missing: {r['file']})")
        else:
            print(f"  {r['ref']}  sha256 {r['sha256']}")
    if cwd is not None:
        print(f"  relative paths resolve against the start folder {cwd}")


def _checkpoint_line(run_dir: Path) -> str | None:
    from replayrl.storage.checkpoint import find_checkpoints, manifest_value

    ckpt, _ = find_checkpoints(run_dir)
    if ckpt is None:
        return None
    written = manifest_value(ckpt, "run_record_hmac")
    if written is None:
        return f"latest checkpoint {ckpt.name}: carries no record signature"
    same = written == record_signature(run_dir)
    return f"latest checkpoint {ckpt.name}: written under " + (
        "this record" if same else "an earlier record (signed again since)"
    )


def _check(run_dir: Path, verdict: Verdict, refs: list[dict[str, Any]], cwd: str | None) -> int:
    if verdict.trusted:
        print(f"trusted: {run_dir}/{RECORD} verifies with your key ({key_path()})")
    else:
        print(f"not trusted: {verdict.reason}")
    print("a resume of it runs:")
    _show_code(refs, cwd)
    line = _checkpoint_line(run_dir)
    if line is not None:
        print(line)
    if not verdict.trusted:
        print(
            f"`replayrl trust {run_dir}` signs it after showing this code, or resume with "
            "--trust-run-code"
        )
    return 0 if verdict.trusted else 1


def _confirm() -> bool:
    if not sys.stdin.isatty():
        raise ConfigError("no terminal to confirm on: pass --yes to sign without asking")
    try:
        return input("trust this code and sign the folder with your key? [y/N] ").strip() in (
            "y",
            "yes",
        )
    except EOFError:
        return False


def cmd_trust(args: argparse.Namespace) -> int:
    from replayrl.run.records.folder import is_run_folder, run_code

    run_dir = Path(args.run_dir)
    if not is_run_folder(run_dir):
        raise ConfigError(f"{run_dir} is not a replayrl run folder (no replayrl config.yaml)")
    cfg, cwd, refs = run_code(run_dir)
    verdict = verify_run_folder(run_dir, cwd, refs)
    if args.check:
        return _check(run_dir, verdict, refs, cwd)
    state = "trusted already" if verdict.trusted else f"not trusted: {verdict.reason}"
    print(f"{run_dir} ({state}); a resume of it runs:")
    _show_code(refs, cwd)
    missing = [r["file"] for r in refs if r["file"] is not None and r["sha256"] is None]
    if missing:
        raise ConfigError(f"reward file {missing[0]} does not exist: nothing was signed")
    if not args.yes and not _confirm():
        print("nothing was signed")
        return 1
    try:
        sign_run_folder(run_dir, cfg.model_dump(mode="json"), cwd, refs)
    except TrustKeyError as exc:
        raise ConfigError(f"nothing was signed: {exc}") from None
    print(
        f"signed {run_dir}/{RECORD} with your key ({key_path()}): `replayrl train --resume "
        f"{run_dir}` runs this code without --trust-run-code"
    )
    return 0
