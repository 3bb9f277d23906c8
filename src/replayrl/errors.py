"""Errors every layer may raise; the CLI turns them into one-line messages."""

from __future__ import annotations


class RunFailed(RuntimeError):
    """An expected failure of a running run (the message names the last good checkpoint)."""
