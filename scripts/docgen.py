"""The command line the reference-page generators share (scripts/gen_*_doc.py): write the
page, or with --check exit 1 when the committed page differs from what the code renders."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from replayrl.storage.io import atomic_write_text


def write_or_check(target: Path, render: Callable[[], str], doc: str, script: str) -> int:
    """`doc`: the generator's module docstring (its first line is the help text)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not target.is_file() or target.read_text() != text:
            print(f"{target} is out of date: run python scripts/{script}")
            return 1
        return 0
    atomic_write_text(target, text)
    print(target)
    return 0
