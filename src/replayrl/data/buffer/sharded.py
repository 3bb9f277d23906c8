"""T shards of one buffer kind (arXiv 2604.08706: each trainer may keep a shard of size N/T)."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from replayrl.data.buffer.base import STAT_KEYS, SeedLike, check_n, make_rng
from replayrl.data.buffer.onpolicy import OnPolicyQueue
from replayrl.data.buffer.replay import ReplayBuffer
from replayrl.data.rollout_record import Rollout

__all__ = ["ShardedBuffer"]

Shard = ReplayBuffer | OnPolicyQueue


class ShardedBuffer:
    """Routes each pushed rollout to exactly one shard, round-robin (push p goes to shard p % T).

    A trainer ``i`` uses ``sample(n, current_version, shard=i)`` (or ``shard(i).sample``).
    ``sample`` without ``shard`` treats the shards as one buffer:

    * replay shards: uniform over the union of the shards' candidates (per-shard counts
      drawn multivariate-hypergeometric without replacement, multinomial with it; each shard
      then draws its share; the batch is shuffled). With positive bias each shard of N // T
      keeps its own fresh window and correct reserve (k = floor(delta * (N // T)));
    * on-policy shards: the freshest ``n`` across shards, freshest first (push order is
      recovered from the round-robin rule, so push through this object, not a shard).

    Shards are built by :func:`replayrl.data.buffer.make_buffer`; all must be the same kind.
    """

    kind = "sharded"

    def __init__(self, shards: Sequence[Shard], *, seed: SeedLike = 0) -> None:
        if not shards:
            raise ValueError("shards=[]: need at least one shard")
        types = {type(s) for s in shards}
        if len(types) != 1 or not issubclass(types.pop(), ReplayBuffer | OnPolicyQueue):
            raise ValueError(
                f"shards={[type(s).__name__ for s in shards]}: all shards must be one kind "
                "(all ReplayBuffer or all OnPolicyQueue)"
            )
        if isinstance(shards[0], ReplayBuffer):
            modes = {s.with_replacement for s in shards}  # type: ignore[union-attr]
            if len(modes) != 1:
                raise ValueError("shards disagree on with_replacement")
        self._shards: list[Shard] = list(shards)
        self._next = 0
        self._rng = make_rng(seed)
        self._lock = threading.RLock()

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def shard_kind(self) -> str:
        return self._shards[0].kind

    @property
    def shards(self) -> list[Shard]:
        return list(self._shards)

    @property
    def capacity(self) -> int | None:
        caps = [s.capacity for s in self._shards]
        return None if any(c is None for c in caps) else sum(caps)  # type: ignore[arg-type]

    def shard(self, i: int) -> Shard:
        """Shard ``i`` (0 <= i < num_shards), e.g. for trainer ``i``."""
        self._check_shard(i)
        return self._shards[i]

    def _check_shard(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self._shards):
            raise ValueError(f"shard={i!r}: must be an int in [0, {len(self._shards)})")
        return i

    def __len__(self) -> int:
        return sum(len(s) for s in self._shards)

    def __repr__(self) -> str:
        return f"ShardedBuffer({self._shards!r})"

    @contextmanager
    def _all_locked(self) -> Iterator[None]:
        with self._lock, ExitStack() as stack:
            for s in self._shards:  # always in index order: no lock-order inversion
                stack.enter_context(s._lock)
            yield

    def push(self, rollouts: Sequence[Rollout]) -> None:
        """Route each rollout to one shard, round-robin, keeping order within a shard."""
        with self._lock:
            t = len(self._shards)
            groups: list[list[Rollout]] = [[] for _ in range(t)]
            nxt = self._next
            for r in rollouts:
                groups[nxt].append(r)
                nxt = nxt + 1 if nxt + 1 < t else 0
            self._next = nxt
            for s, g in zip(self._shards, groups, strict=True):
                if g:
                    s.push(g)

    def sample(
        self, n: int, current_version: int | None = None, *, shard: int | None = None
    ) -> list[Rollout]:
        """Sample from shard ``shard``, or from all shards as one buffer when it is None."""
        if shard is not None:
            return self._shards[self._check_shard(shard)].sample(n, current_version)
        n = check_n(n)
        with self._all_locked():
            if isinstance(self._shards[0], OnPolicyQueue):
                return self._sample_freshest(n, current_version)
            return self._sample_union(n, current_version)

    def _sample_freshest(self, n: int, current_version: int | None) -> list[Rollout]:
        t = len(self._shards)
        shards: list[OnPolicyQueue] = self._shards  # type: ignore[assignment]
        heap: list[tuple[int, int]] = []
        for i, s in enumerate(shards):
            s._drop_stale(current_version)
            o = s._peek_freshest_ordinal()
            if o is not None:
                heap.append((-(o * t + i), i))
        heapq.heapify(heap)
        out: list[Rollout] = []
        while heap and len(out) < n:
            _, i = heapq.heappop(heap)
            out.append(shards[i]._pop_freshest())
            o = shards[i]._peek_freshest_ordinal()
            if o is not None:
                heapq.heappush(heap, (-(o * t + i), i))
        return out

    def _sample_union(self, n: int, current_version: int | None) -> list[Rollout]:
        shards: list[ReplayBuffer] = self._shards  # type: ignore[assignment]
        sizes = [s._num_candidates(current_version) for s in shards]
        total = sum(sizes)
        if n == 0 or total == 0:
            return []
        if shards[0].with_replacement:
            counts = self._rng.multinomial(n, [m / total for m in sizes])
        else:
            counts = self._rng.multivariate_hypergeometric(sizes, min(n, total))
        batch: list[Rollout] = []
        for s, k in zip(shards, counts.tolist(), strict=True):
            if k:
                batch.extend(s._sample_locked(k))
        return [batch[j] for j in self._rng.permutation(len(batch)).tolist()]

    def stats(self) -> dict[str, float]:
        with self._all_locked():
            per = [s.stats() for s in self._shards]
        out = {k: float(sum(p[k] for p in per)) for k in STAT_KEYS}
        for key in ("candidates", "reserve_size"):
            if key in per[0]:
                out[key] = float(sum(p[key] for p in per))
        out["num_shards"] = float(len(per))
        return out

    def state_dict(self) -> dict[str, Any]:
        with self._all_locked():
            return {
                "kind": self.kind,
                "shard_kind": self.shard_kind,
                "num_shards": len(self._shards),
                "next": self._next,
                "rng": dict(self._rng.bit_generator.state),
                "shards": [s.state_dict() for s in self._shards],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._all_locked():
            mine = {"kind": self.kind, "shard_kind": self.shard_kind, "num_shards": self.num_shards}
            for key, value in mine.items():
                if state.get(key) != value:
                    raise ValueError(
                        f"state_dict {key}={state.get(key)!r} does not match this buffer's "
                        f"{key}={value!r}"
                    )
            for s, sd in zip(self._shards, state["shards"], strict=True):
                s.load_state_dict(sd)
            self._next = int(state["next"])
            self._rng.bit_generator.state = state["rng"]
