"""FIFO replay buffer (papers.md, paper 1): push evicts the oldest, sample does not remove."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from replayrl.buffer.base import (
    BaseBuffer,
    SeedLike,
    check_int,
    check_n,
    decode_rollouts,
    encode_rollouts,
)
from replayrl.buffer.samplers import CandidateSet, Sampler, draw_indices, make_sampler
from replayrl.rollout import Rollout

__all__ = ["ReplayBuffer"]


class ReplayBuffer(BaseBuffer):
    """FIFO of capacity N; ``sample(B)`` draws uniformly from the candidate set, keeps items.

    Storage is a preallocated ring: a Python list of ``capacity`` slots, a head index and a
    count, plus numpy arrays (correctness, policy version per slot) and a second ring holding
    the push ordinals of the stored *correct* rollouts in order. ``push`` is O(1) per rollout;
    ``sample(B)`` is O(B + log N) (numpy index arithmetic, Floyd's algorithm for distinct
    indices); positive-bias needs one binary search over the correct-ordinal ring.

    Semantics:

    * ``with_replacement=False`` (default): one call returns distinct stored rollouts. If fewer
      than ``n`` candidates exist it returns *all* of them, once each, in random order (so the
      batch may be shorter than ``n``).
    * ``with_replacement=True``: exactly ``n`` i.i.d. draws (``[]`` only if the buffer is empty);
      a rollout drawn twice in one batch has ``times_sampled`` incremented twice.
    * sampler: ``"uniform"`` or ``"positive_bias"`` with ``delta`` (see
      :class:`replayrl.buffer.samplers.PositiveBias` for the candidate-set rule).
    * ``max_staleness``: when ``sample`` gets a ``current_version``, every stored rollout with
      ``current_version - policy_version > max_staleness`` is removed (counted in
      ``dropped_stale``, not ``evicted``) before drawing, so none can be returned. A per-version
      count says in O(#distinct versions) whether anything is stale; only then is the ring
      touched: O(#stale) if the stale rollouts are the oldest ones (versions rising in push
      order, the usual case), else one O(N) compaction. Without ``current_version`` nothing is
      filtered.
    """

    kind = "replay"

    def __init__(
        self,
        capacity: int,
        *,
        sampler: str = "uniform",
        delta: float = 0.0,
        with_replacement: bool = False,
        max_staleness: int | None = None,
        seed: SeedLike = 0,
    ) -> None:
        cap = check_int("capacity", capacity, 1)
        super().__init__(cap, max_staleness, seed)
        self._cap = cap
        self._sampler: Sampler = make_sampler(sampler, delta)
        self._sampler_name = self._sampler.name
        self._delta = float(delta)
        self._replace = bool(with_replacement)
        self._items: list[Rollout | None] = [None] * cap
        self._correct = np.zeros(cap, dtype=np.bool_)
        self._version = np.zeros(cap, dtype=np.int64)
        self._head = 0  # slot of the oldest stored rollout
        self._count = 0
        self._base = 0  # push ordinal of the oldest stored rollout (offset o <-> _base + o)
        # ring of push ordinals of stored correct rollouts, increasing from _chead
        self._cord = np.zeros(cap, dtype=np.int64)
        self._chead = 0
        self._ccount = 0

    # -- properties ------------------------------------------------------------------------
    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def with_replacement(self) -> bool:
        return self._replace

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={self._count}, capacity={self._cap}, sampler={self._sampler!r}, "
            f"with_replacement={self._replace}, max_staleness={self._max_staleness})"
        )

    # -- push / evict ----------------------------------------------------------------------
    def push(self, rollouts: Sequence[Rollout]) -> None:
        """Append rollouts (in order); when full, each push evicts the oldest stored rollout."""
        with self._lock:
            cap = self._cap
            items = self._items
            for r in rollouts:
                if self._count == cap:
                    self._pop_oldest()
                    self._evicted += 1
                slot = self._head + self._count
                if slot >= cap:
                    slot -= cap
                items[slot] = r
                v = r.policy_version
                self._version[slot] = v
                if r.correct:
                    self._correct[slot] = True
                    c = self._chead + self._ccount
                    self._cord[c - cap if c >= cap else c] = self._base + self._count
                    self._ccount += 1
                else:
                    self._correct[slot] = False
                self._count += 1
                if self._vcounts is not None:
                    self._vc_add(v)
            self._pushed += len(rollouts)

    def _pop_oldest(self) -> None:
        slot = self._head
        self._items[slot] = None
        if self._correct[slot]:
            self._chead = self._chead + 1 if self._chead + 1 < self._cap else 0
            self._ccount -= 1
        if self._vcounts is not None:
            self._vc_remove(int(self._version[slot]))
        self._head = slot + 1 if slot + 1 < self._cap else 0
        self._count -= 1
        self._base += 1

    # -- staleness -----------------------------------------------------------------------
    def _offset_slots(self) -> np.ndarray:
        return (self._head + np.arange(self._count, dtype=np.int64)) % self._cap

    def _drop_stale(self, current_version: int | None) -> None:
        threshold = self._stale_threshold(current_version)
        if threshold is None:
            return
        n_stale = self._num_stale(threshold)
        prefix = (self._head + np.arange(n_stale, dtype=np.int64)) % self._cap
        if bool((self._version[prefix] < threshold).all()):
            for _ in range(n_stale):  # the stale ones are exactly the oldest: O(#stale)
                self._pop_oldest()
        else:
            self._compact(self._version[self._offset_slots()] >= threshold)
        self._dropped_stale += n_stale

    def _compact(self, keep_mask: np.ndarray) -> None:
        """Keep the rollouts at offsets where ``keep_mask`` is True, in order. O(N)."""
        keep = self._offset_slots()[keep_mask]
        cap = self._cap
        kept = [self._items[s] for s in keep.tolist()]
        self._items = kept + [None] * (cap - len(kept))
        correct = np.zeros(cap, dtype=np.bool_)
        correct[: len(kept)] = self._correct[keep]
        version = np.zeros(cap, dtype=np.int64)
        version[: len(kept)] = self._version[keep]
        self._correct, self._version = correct, version
        self._head, self._count = 0, len(kept)
        self._rebuild_correct_index()
        self._vc_rebuild(version[: len(kept)].tolist())

    def _rebuild_correct_index(self) -> None:
        """Recompute the correct-ordinal ring from ``_correct`` (head must be 0)."""
        assert self._head == 0
        ords = np.flatnonzero(self._correct[: self._count]).astype(np.int64) + self._base
        self._cord = np.zeros(self._cap, dtype=np.int64)
        self._cord[: len(ords)] = ords
        self._chead, self._ccount = 0, len(ords)

    # -- sampling ------------------------------------------------------------------------
    def _correct_before(self, offset: int) -> int:
        """Number of stored correct rollouts at offsets < ``offset`` (binary search)."""
        if self._ccount == 0:
            return 0
        target = self._base + offset
        end = self._chead + self._ccount
        first = self._cord[self._chead : min(end, self._cap)]
        i = int(np.searchsorted(first, target))
        if i < len(first) or end <= self._cap:
            return i
        return i + int(np.searchsorted(self._cord[: end - self._cap], target))

    def _candidates(self) -> CandidateSet:
        return self._sampler(self._count, self._cap, self._correct_before)

    def _offsets(self, cs: CandidateSet, idx: np.ndarray) -> np.ndarray:
        """Candidate indices (fresh window first, then extras oldest first) -> offsets."""
        offsets = idx + cs.fresh_start
        if cs.n_extra:
            extra = idx >= cs.n_fresh
            if extra.any():
                ranks = idx[extra] - cs.n_fresh + cs.first_extra_rank
                ords = self._cord[(self._chead + ranks) % self._cap]
                offsets[extra] = ords - self._base
        return offsets

    def _num_candidates(self, current_version: int | None) -> int:
        """Drop stale rollouts, then count candidates (used by ShardedBuffer). Lock held."""
        self._drop_stale(current_version)
        return len(self._candidates())

    def _sample_locked(self, n: int) -> list[Rollout]:
        cs = self._candidates()
        idx = draw_indices(self._rng, len(cs), n, self._replace)
        slots = self._offsets(cs, idx)
        slots += self._head
        slots %= self._cap
        items = self._items
        batch: list[Rollout] = [items[s] for s in slots.tolist()]  # type: ignore[misc]
        for r in batch:
            r.times_sampled += 1
        self._consumed += len(batch)
        return batch

    def sample(self, n: int, current_version: int | None = None) -> list[Rollout]:
        """Draw ``n`` candidates uniformly (see class docstring); stored rollouts stay stored."""
        n = check_n(n)
        with self._lock:
            self._drop_stale(current_version)
            return self._sample_locked(n)

    # -- introspection -------------------------------------------------------------------
    def items(self) -> list[Rollout]:
        """Stored rollouts, oldest first."""
        with self._lock:
            return [self._items[s] for s in self._offset_slots().tolist()]  # type: ignore[misc]

    def candidates(self, current_version: int | None = None) -> list[Rollout]:
        """Rollouts the next ``sample`` may return, oldest first (drops stale ones first)."""
        with self._lock:
            self._drop_stale(current_version)
            cs = self._candidates()
            offsets = np.sort(self._offsets(cs, np.arange(len(cs), dtype=np.int64)))
            slots = (offsets + self._head) % self._cap
            return [self._items[s] for s in slots.tolist()]  # type: ignore[misc]

    def overhead_nbytes(self) -> int:
        """Bytes of the buffer's own bookkeeping (slot list and index arrays), not the rollouts."""
        with self._lock:
            arrays = (self._correct, self._version, self._cord)
            return sys.getsizeof(self._items) + sum(a.nbytes for a in arrays)

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = self._base_stats(self._count)
            out["candidates"] = float(len(self._candidates()))
            return out

    # -- state ---------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "capacity": self._cap,
            "sampler": self._sampler_name,
            "delta": self._delta,
            "with_replacement": self._replace,
            "max_staleness": self._max_staleness,
        }

    def state_dict(self) -> dict[str, Any]:
        """Config, stored rollouts (oldest first, as plain dicts), counters and RNG state."""
        with self._lock:
            table, order = encode_rollouts(self.items())
            return {
                **self._config(),
                "rollouts": table,
                "order": order,
                "base": self._base,
                "counters": self._counters(),
                "rng": self._rng_state(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` of a buffer with the same configuration (else ValueError)."""
        with self._lock:
            self._check_config(state, self._config())
            items = decode_rollouts(state["rollouts"], state["order"])
            cap = self._cap
            if len(items) > cap:
                raise ValueError(f"state_dict holds {len(items)} rollouts > capacity={cap}")
            self._items = list(items) + [None] * (cap - len(items))
            self._correct = np.zeros(cap, dtype=np.bool_)
            self._version = np.zeros(cap, dtype=np.int64)
            for i, r in enumerate(items):
                self._correct[i] = bool(r.correct)
                self._version[i] = r.policy_version
            self._head, self._count, self._base = 0, len(items), int(state["base"])
            self._rebuild_correct_index()
            self._vc_rebuild(r.policy_version for r in items)
            self._load_counters(state["counters"])
            self._load_rng_state(state["rng"])
