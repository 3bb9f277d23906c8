"""The common buffer interface and the plumbing every buffer kind shares."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from replayrl.data.rollout_record import Rollout

__all__ = ["Buffer", "SeedLike", "rollout_from_dict", "rollout_to_dict"]

SeedLike = int | np.random.SeedSequence

STAT_KEYS = ("size", "capacity", "pushed", "evicted", "consumed", "dropped_stale")

_ROLLOUT_FIELDS = tuple(f.name for f in dataclasses.fields(Rollout))


@runtime_checkable
class Buffer(Protocol):
    """What every buffer kind offers (replay FIFO, on-policy LIFO, sharded)."""

    kind: str

    def push(self, rollouts: Sequence[Rollout]) -> None:
        """Store rollouts (oldest first within the call)."""
        ...

    def sample(self, n: int, current_version: int | None = None) -> list[Rollout]:
        """Return up to ``n`` rollouts; increments each returned rollout's ``times_sampled``."""
        ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]:
        """Plain data (torch.save-able, loads with ``weights_only=True``)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore exactly: subsequent samples equal those the saved buffer would have drawn."""
        ...

    def stats(self) -> dict[str, float]:
        """At least: size, capacity, pushed, evicted, consumed, dropped_stale."""
        ...


def rollout_to_dict(r: Rollout) -> dict[str, Any]:
    """Shallow plain-data view of a rollout (tensors are shared, ``extras`` is copied)."""
    d = {name: getattr(r, name) for name in _ROLLOUT_FIELDS}
    d["extras"] = dict(r.extras)
    return d


def rollout_from_dict(d: dict[str, Any]) -> Rollout:
    fields: dict[str, Any] = {k: (dict(v) if k == "extras" else v) for k, v in d.items()}
    return Rollout(**fields)


def encode_rollouts(items: Iterable[Rollout]) -> tuple[list[dict[str, Any]], list[int]]:
    """Unique rollouts (by identity) and, per stored slot, the index of its rollout."""
    table: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    order: list[int] = []
    for r in items:
        j = seen.get(id(r))
        if j is None:
            j = seen[id(r)] = len(table)
            table.append(rollout_to_dict(r))
        order.append(j)
    return table, order


def decode_rollouts(table: list[dict[str, Any]], order: list[int]) -> list[Rollout]:
    objs = [rollout_from_dict(d) for d in table]
    return [objs[j] for j in order]


def make_rng(seed: SeedLike) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int | np.random.SeedSequence):
        raise ValueError(f"seed={seed!r}: must be a non-negative int")
    if isinstance(seed, int) and seed < 0:
        raise ValueError(f"seed={seed!r}: must be a non-negative int")
    return np.random.Generator(np.random.PCG64(seed))


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an int >= {minimum}")
    return int(value)


def check_n(n: Any) -> int:
    return check_int("n", n, 0)


def check_max_staleness(value: Any) -> int | None:
    return None if value is None else check_int("max_staleness", value, 0)


class BaseBuffer:
    """Shared counters, RNG, lock and staleness bookkeeping. Not part of the public API."""

    kind = "base"

    def __init__(self, capacity: int | None, max_staleness: int | None, seed: SeedLike) -> None:
        self._capacity = capacity
        self._max_staleness = check_max_staleness(max_staleness)
        self._rng = make_rng(seed)
        self._lock = threading.RLock()
        self._pushed = 0
        self._evicted = 0
        self._consumed = 0
        self._dropped_stale = 0
        # policy_version -> number of stored rollouts with it (only with a staleness filter):
        # tells in O(#versions) whether anything is stale, so the O(N) scan runs only then.
        self._vcounts: dict[int, int] | None = {} if self._max_staleness is not None else None

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def max_staleness(self) -> int | None:
        return self._max_staleness

    # -- staleness helpers -------------------------------------------------------------
    def _vc_add(self, v: int) -> None:
        vc = self._vcounts
        if vc is not None:
            vc[v] = vc.get(v, 0) + 1

    def _vc_remove(self, v: int) -> None:
        vc = self._vcounts
        if vc is not None:
            c = vc[v] - 1
            if c:
                vc[v] = c
            else:
                del vc[v]

    def _vc_rebuild(self, versions: Iterable[int]) -> None:
        if self._vcounts is not None:
            self._vcounts = {}
            for v in versions:
                self._vc_add(int(v))

    def _stale_threshold(self, current_version: int | None) -> int | None:
        """Smallest policy_version still fresh enough, or None when nothing can be stale."""
        if self._max_staleness is None or current_version is None or not self._vcounts:
            return None
        threshold = int(current_version) - self._max_staleness
        if min(self._vcounts) >= threshold:
            return None
        return threshold

    def _num_stale(self, threshold: int) -> int:
        assert self._vcounts is not None
        return sum(c for v, c in self._vcounts.items() if v < threshold)

    # -- shared state_dict pieces ------------------------------------------------------
    def _counters(self) -> dict[str, int]:
        return {
            "pushed": self._pushed,
            "evicted": self._evicted,
            "consumed": self._consumed,
            "dropped_stale": self._dropped_stale,
        }

    def _load_counters(self, c: dict[str, int]) -> None:
        self._pushed = int(c["pushed"])
        self._evicted = int(c["evicted"])
        self._consumed = int(c["consumed"])
        self._dropped_stale = int(c["dropped_stale"])

    def _check_config(self, state: dict[str, Any], config: dict[str, Any]) -> None:
        for key, mine in config.items():
            theirs = state.get(key)
            if theirs != mine:
                raise ValueError(
                    f"state_dict {key}={theirs!r} does not match this buffer's {key}={mine!r}"
                )

    def _base_stats(self, size: int) -> dict[str, float]:
        return {
            "size": float(size),
            "capacity": float("inf") if self._capacity is None else float(self._capacity),
            "pushed": float(self._pushed),
            "evicted": float(self._evicted),
            "consumed": float(self._consumed),
            "dropped_stale": float(self._dropped_stale),
        }

    def _rng_state(self) -> dict[str, Any]:
        return dict(self._rng.bit_generator.state)

    def _load_rng_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state
