"""On-policy baseline of paper 1 (arXiv 2604.08706): LIFO, freshest first, removed once used."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from replayrl.data.buffer.base import (
    BaseBuffer,
    SeedLike,
    check_int,
    check_n,
    decode_rollouts,
    encode_rollouts,
)
from replayrl.data.rollout_record import Rollout

__all__ = ["OnPolicyQueue"]


class OnPolicyQueue(BaseBuffer):
    """LIFO: ``sample(n)`` removes and returns the freshest ``min(n, len)`` rollouts.

    The batch is ordered freshest first. ``capacity=None`` means unbounded; otherwise a push
    beyond capacity evicts the oldest (counted in ``evicted``). With ``max_staleness`` and a
    ``current_version``, every stale rollout in the queue is removed before taking the batch
    (counted in ``dropped_stale``); the scan only runs when a per-version count says something
    is stale. The RNG is unused (LIFO is deterministic) but kept for a uniform interface.
    """

    kind = "onpolicy"

    def __init__(
        self,
        capacity: int | None = None,
        *,
        max_staleness: int | None = None,
        seed: SeedLike = 0,
    ) -> None:
        cap = None if capacity is None else check_int("capacity", capacity, 1)
        super().__init__(cap, max_staleness, seed)
        # (push ordinal within this queue, rollout); ordinals let ShardedBuffer merge shards
        self._q: deque[tuple[int, Rollout]] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __repr__(self) -> str:
        return (
            f"OnPolicyQueue(size={len(self._q)}, capacity={self._capacity}, "
            f"max_staleness={self._max_staleness})"
        )

    def push(self, rollouts: Sequence[Rollout]) -> None:
        """Append rollouts (in order); evicts the oldest beyond capacity."""
        with self._lock:
            q = self._q
            cap = self._capacity
            for r in rollouts:
                q.append((self._pushed, r))
                self._pushed += 1
                if self._vcounts is not None:
                    self._vc_add(r.policy_version)
                if cap is not None and len(q) > cap:
                    _, old = q.popleft()
                    self._evicted += 1
                    if self._vcounts is not None:
                        self._vc_remove(old.policy_version)

    def _drop_stale(self, current_version: int | None) -> None:
        threshold = self._stale_threshold(current_version)
        if threshold is None:
            return
        kept = deque(e for e in self._q if e[1].policy_version >= threshold)
        self._dropped_stale += len(self._q) - len(kept)
        self._q = kept
        self._vc_rebuild(e[1].policy_version for e in kept)

    def _peek_freshest_ordinal(self) -> int | None:
        return self._q[-1][0] if self._q else None

    def _pop_freshest(self) -> Rollout:
        _, r = self._q.pop()
        if self._vcounts is not None:
            self._vc_remove(r.policy_version)
        r.times_sampled += 1
        self._consumed += 1
        return r

    def sample(self, n: int, current_version: int | None = None) -> list[Rollout]:
        """Remove and return the freshest ``min(n, len)`` rollouts, freshest first."""
        n = check_n(n)
        with self._lock:
            self._drop_stale(current_version)
            return [self._pop_freshest() for _ in range(min(n, len(self._q)))]

    def items(self) -> list[Rollout]:
        """Stored rollouts, oldest first."""
        with self._lock:
            return [r for _, r in self._q]

    def stats(self) -> dict[str, float]:
        with self._lock:
            return self._base_stats(len(self._q))

    def _config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "capacity": self._capacity,
            "max_staleness": self._max_staleness,
        }

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            table, order = encode_rollouts(r for _, r in self._q)
            return {
                **self._config(),
                "rollouts": table,
                "order": order,
                "ordinals": [o for o, _ in self._q],
                "counters": self._counters(),
                "rng": self._rng_state(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._check_config(state, self._config())
            items = decode_rollouts(state["rollouts"], state["order"])
            if self._capacity is not None and len(items) > self._capacity:
                raise ValueError(
                    f"state_dict holds {len(items)} rollouts > capacity={self._capacity}"
                )
            self._q = deque(zip((int(o) for o in state["ordinals"]), items, strict=True))
            self._vc_rebuild(r.policy_version for r in items)
            self._load_counters(state["counters"])
            self._load_rng_state(state["rng"])
