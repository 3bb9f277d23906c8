"""FIFO replay buffer (arXiv 2604.08706): push evicts the oldest, sample does not remove.

With positive bias (``delta``) the buffer is two FIFOs, a fresh window of ``N - k`` and a
correct reserve of ``k = floor(delta*N)`` that catches correct rollouts leaving the window:
paper 1 samples "uniformly from the freshest (1-delta)N rollouts plus the freshest delta*N
correct rollouts not already among them".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from replayrl.data.buffer.base import (
    BaseBuffer,
    SeedLike,
    check_int,
    check_n,
    decode_rollouts,
    encode_rollouts,
)
from replayrl.data.buffer.samplers import Sampler, draw_indices, make_sampler
from replayrl.data.rollout_record import Rollout

__all__ = ["ReplayBuffer"]


class _Ring:
    """Fixed-capacity FIFO: a preallocated slot list, policy versions per slot, head and count.

    Offsets are positions in push order: 0 is the oldest stored rollout. Capacity may be 0
    (the reserve of a uniform buffer); then nothing is ever stored.
    """

    __slots__ = ("cap", "count", "head", "items", "version")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.reset([])

    def reset(self, rollouts: Sequence[Rollout], versions: Sequence[int] | None = None) -> None:
        """Hold exactly ``rollouts`` (oldest first; ``len <= cap``), head at slot 0."""
        n = len(rollouts)
        assert n <= self.cap
        self.items: list[Rollout | None] = list(rollouts) + [None] * (self.cap - n)
        self.version = np.zeros(self.cap, dtype=np.int64)
        if n:
            vs = [r.policy_version for r in rollouts] if versions is None else versions
            self.version[:n] = vs
        self.head = 0
        self.count = n

    def append(self, r: Rollout, version: int) -> None:
        """Store ``r`` as the freshest (the caller makes room first)."""
        slot = self.head + self.count
        if slot >= self.cap:
            slot -= self.cap
        self.items[slot] = r
        self.version[slot] = version
        self.count += 1

    def pop_oldest(self) -> tuple[Rollout, int]:
        """Remove the oldest stored rollout; returns it and its stored policy version."""
        slot = self.head
        r = self.items[slot]
        self.items[slot] = None
        self.head = slot + 1 if slot + 1 < self.cap else 0
        self.count -= 1
        return r, int(self.version[slot])  # type: ignore[return-value]

    def slots(self, n: int | None = None) -> np.ndarray:
        """Slots of the oldest ``n`` (default: all) stored rollouts, oldest first."""
        n = self.count if n is None else n
        if n == 0:
            return np.empty(0, dtype=np.int64)
        return (self.head + np.arange(n, dtype=np.int64)) % self.cap

    def take(self, offsets: np.ndarray) -> list[Rollout]:
        """Rollouts at ``offsets`` (each in ``[0, count)``), in the given order."""
        if len(offsets) == 0:
            return []
        slots = (offsets + self.head) % self.cap
        items = self.items
        return [items[s] for s in slots.tolist()]

    def ordered(self) -> list[Rollout]:
        items = self.items
        return [items[s] for s in self.slots().tolist()]

    def versions(self) -> np.ndarray:
        return self.version[self.slots()]

    def keep(self, mask: np.ndarray) -> None:
        """Keep the rollouts at offsets where ``mask`` is True, in order. O(count)."""
        keep = self.slots()[mask]
        items = self.items
        self.reset([items[s] for s in keep.tolist()], self.version[keep])

    def nbytes(self) -> int:
        return sys.getsizeof(self.items) + self.version.nbytes


class ReplayBuffer(BaseBuffer):
    """FIFO of capacity N; ``sample(B)`` draws uniformly from what is stored, keeps items.

    Storage: a *fresh window*, FIFO of capacity ``N - k``, and a *correct reserve*, FIFO of
    capacity ``k`` (``k = 0`` for ``sampler="uniform"``, ``floor(delta*N)`` for
    ``"positive_bias"``; see :class:`replayrl.data.buffer.samplers.PositiveBias`). Each is a
    preallocated ring (slot list, head, count, policy version per slot). When a push finds
    the window full, its oldest rollout leaves it: a correct one (``rollout.correct``) enters
    the reserve, evicting the reserve's oldest if that is full; an incorrect one is evicted.
    Paper 1's rule, "uniform over the freshest (1-delta)N rollouts plus the freshest delta*N
    correct rollouts not already among them", is then: every stored rollout is a candidate.
    At most N are stored; ``delta = 0`` is exactly the uniform buffer.

    ``push`` is O(1) per rollout; ``sample(B)`` is O(B) (numpy index arithmetic; distinct
    indices by ``Generator.choice``). Candidate index ``i`` is the ``i``-th stored rollout in
    :meth:`items` order: the reserve oldest first, then the window oldest first. That is push
    order: a rollout enters the reserve as the window's oldest, so everything in the reserve
    was pushed before anything now in the window.

    Semantics:

    * ``with_replacement=False`` (default): one call returns distinct stored rollouts. If fewer
      than ``n`` are stored it returns *all* of them, once each, in random order (so the batch
      may be shorter than ``n``).
    * ``with_replacement=True``: exactly ``n`` i.i.d. draws (``[]`` only if the buffer is empty);
      a rollout drawn twice in one batch has ``times_sampled`` incremented twice.
    * ``evicted`` counts rollouts pushed out of the buffer (incorrect ones leaving the window,
      correct ones leaving the reserve); moving window -> reserve is not an eviction.
    * ``max_staleness``: when ``sample`` gets a ``current_version``, every stored rollout (window
      or reserve) with ``current_version - policy_version > max_staleness`` is removed (counted
      in ``dropped_stale``, not ``evicted``) before drawing, so none can be returned; nothing
      moves back into the window in their place. A per-version count says in O(#distinct
      versions) whether anything is stale; only then are the rings touched: O(#stale) if the
      stale rollouts are the oldest ones (versions rising in push order, the usual case), else
      one O(N) compaction. Without ``current_version`` nothing is filtered.
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
        k = self._sampler.reserve_capacity(cap)
        self._fresh = _Ring(cap - k)  # the freshest N - k pushed
        self._reserve = _Ring(k)  # the freshest k correct ones that left the window

    # -- properties ------------------------------------------------------------------------
    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def with_replacement(self) -> bool:
        return self._replace

    @property
    def fresh_capacity(self) -> int:
        """``N - k``: size of the fresh window."""
        return self._fresh.cap

    @property
    def reserve_capacity(self) -> int:
        """``k = floor(delta*N)``: size of the correct reserve (0 for uniform)."""
        return self._reserve.cap

    def __len__(self) -> int:
        return self._fresh.count + self._reserve.count

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={len(self)}, capacity={self._cap}, sampler={self._sampler!r}, "
            f"reserve={self._reserve.count}/{self._reserve.cap}, "
            f"with_replacement={self._replace}, max_staleness={self._max_staleness})"
        )

    # -- push / evict ----------------------------------------------------------------------
    def push(self, rollouts: Sequence[Rollout]) -> None:
        """Append rollouts (in order) to the window; a full window hands its oldest on.

        The rollout leaving the window goes to the correct reserve if it is correct and the
        reserve has capacity (the reserve's oldest is then evicted if it was full), else it is
        evicted.
        """
        with self._lock:
            fresh, reserve = self._fresh, self._reserve
            fcap, rcap = fresh.cap, reserve.cap
            track = self._vcounts is not None
            for r in rollouts:
                if fresh.count == fcap:
                    old, v = fresh.pop_oldest()
                    if rcap and old.correct:
                        if reserve.count == rcap:
                            _, rv = reserve.pop_oldest()
                            self._evicted += 1
                            if track:
                                self._vc_remove(rv)
                        reserve.append(old, v)
                    else:
                        self._evicted += 1
                        if track:
                            self._vc_remove(v)
                v = r.policy_version
                fresh.append(r, v)
                if track:
                    self._vc_add(v)
            self._pushed += len(rollouts)

    # -- staleness -----------------------------------------------------------------------
    def _drop_stale(self, current_version: int | None) -> None:
        threshold = self._stale_threshold(current_version)
        if threshold is None:
            return
        n_stale = self._num_stale(threshold)
        fresh, reserve = self._fresh, self._reserve
        a = min(n_stale, reserve.count)  # the oldest stored: reserve first, then window
        b = n_stale - a
        if bool((reserve.version[reserve.slots(a)] < threshold).all()) and bool(
            (fresh.version[fresh.slots(b)] < threshold).all()
        ):
            for ring, m in ((reserve, a), (fresh, b)):  # exactly the oldest: O(#stale)
                for _ in range(m):
                    self._vc_remove(ring.pop_oldest()[1])
        else:
            for ring in (reserve, fresh):
                ring.keep(ring.versions() >= threshold)
            self._vc_rebuild([*reserve.versions().tolist(), *fresh.versions().tolist()])
        self._dropped_stale += n_stale

    # -- sampling ------------------------------------------------------------------------
    def _take(self, idx: np.ndarray) -> list[Rollout]:
        """Candidate indices (reserve oldest first, then window oldest first) -> rollouts."""
        fresh, reserve = self._fresh, self._reserve
        nr = reserve.count
        if nr == 0:
            return fresh.take(idx)
        in_res = idx < nr
        slots = np.where(  # fresh.cap >= 1 always (k <= N - 1)
            in_res, (idx + reserve.head) % reserve.cap, (idx - nr + fresh.head) % fresh.cap
        )
        ri, fi = reserve.items, fresh.items
        return [
            ri[s] if res else fi[s] for s, res in zip(slots.tolist(), in_res.tolist(), strict=True)
        ]

    def _num_candidates(self, current_version: int | None) -> int:
        """Drop stale rollouts, then count candidates (used by ShardedBuffer). Lock held."""
        self._drop_stale(current_version)
        return len(self)

    def _sample_locked(self, n: int) -> list[Rollout]:
        idx = draw_indices(self._rng, len(self), n, self._replace)
        batch = self._take(idx)
        for r in batch:
            r.times_sampled += 1
        self._consumed += len(batch)
        return batch

    def sample(self, n: int, current_version: int | None = None) -> list[Rollout]:
        """Draw ``n`` stored rollouts uniformly (see class docstring); they stay stored."""
        n = check_n(n)
        with self._lock:
            self._drop_stale(current_version)
            return self._sample_locked(n)

    # -- introspection -------------------------------------------------------------------
    def items(self) -> list[Rollout]:
        """Stored rollouts, oldest first: the correct reserve, then the fresh window."""
        with self._lock:
            return self._reserve.ordered() + self._fresh.ordered()

    def fresh_items(self) -> list[Rollout]:
        """The fresh window (the freshest ``N - k`` pushed, minus stale drops), oldest first."""
        with self._lock:
            return self._fresh.ordered()

    def reserve_items(self) -> list[Rollout]:
        """The correct reserve (correct rollouts that left the window), oldest first."""
        with self._lock:
            return self._reserve.ordered()

    def candidates(self, current_version: int | None = None) -> list[Rollout]:
        """Rollouts the next ``sample`` may return, oldest first (drops stale ones first).

        Every stored rollout is a candidate, so this is :meth:`items` after the staleness drop.
        """
        with self._lock:
            self._drop_stale(current_version)
            return self.items()

    def overhead_nbytes(self) -> int:
        """Bytes of the buffer's own bookkeeping (slot lists and version arrays), not rollouts."""
        with self._lock:
            return self._fresh.nbytes() + self._reserve.nbytes()

    def stats(self) -> dict[str, float]:
        """The common keys, plus ``candidates`` (= size) and ``reserve_size``."""
        with self._lock:
            out = self._base_stats(len(self))
            out["candidates"] = float(len(self))
            out["reserve_size"] = float(self._reserve.count)
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
        """Config, stored rollouts (:meth:`items` order, plain dicts), counters and RNG state.

        ``reserve_size`` says how many of the leading rollouts are the correct reserve.
        """
        with self._lock:
            table, order = encode_rollouts(self.items())
            return {
                **self._config(),
                "rollouts": table,
                "order": order,
                "reserve_size": self._reserve.count,
                "counters": self._counters(),
                "rng": self._rng_state(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` of a buffer with the same configuration (else ValueError).

        A state saved before the correct reserve existed (no ``reserve_size``: one FIFO of up to
        N, oldest first) is split as pushing it would: the freshest ``N - k`` form the window,
        the freshest ``k`` correct ones older than them the reserve; the rest are dropped.
        """
        with self._lock:
            self._check_config(state, self._config())
            items = decode_rollouts(state["rollouts"], state["order"])
            fresh, reserve = self._fresh, self._reserve
            if len(items) > self._cap:
                raise ValueError(f"state_dict holds {len(items)} rollouts > capacity={self._cap}")
            if "reserve_size" in state:
                nr = int(state["reserve_size"])
                if not 0 <= nr <= reserve.cap or len(items) - nr > fresh.cap:
                    raise ValueError(
                        f"state_dict reserve_size={nr} does not fit a reserve of {reserve.cap} "
                        f"and a window of {fresh.cap} ({len(items)} rollouts)"
                    )
                kept_reserve, kept_fresh = items[:nr], items[nr:]
            else:  # a single FIFO's state (no split): the newest window is fresh, the rest reserve
                split = max(0, len(items) - fresh.cap)
                older = [r for r in items[:split] if r.correct]
                kept_reserve = older[max(0, len(older) - reserve.cap) :] if reserve.cap else []
                kept_fresh = items[split:]
            reserve.reset(kept_reserve)
            fresh.reset(kept_fresh)
            self._vc_rebuild(r.policy_version for r in (*kept_reserve, *kept_fresh))
            self._load_counters(state["counters"])
            self._load_rng_state(state["rng"])
