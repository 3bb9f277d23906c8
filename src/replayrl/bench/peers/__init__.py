"""Peer implementations of the same experiment in other libraries, logged in replayrl's format.

Each peer trains the same warm start on the same task and reward and writes `metrics.jsonl`
and `summary.json` like `replayrl.run.start`, so it can sit in the same benchmark table.
The peers' libraries are optional (`pip install 'replayrl[bench]'`); importing this package
does not import them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_trl_grpo", "trl_grpo_settings"]


def __getattr__(name: str) -> Any:  # lazy: `trl` is only imported when a peer runs
    if name in __all__:
        from replayrl.bench.peers import trl_grpo

        return getattr(trl_grpo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
