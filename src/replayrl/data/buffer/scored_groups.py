"""A buffer of whole groups kept by score: TRL's former GRPOWithReplayBufferTrainer's store.

TRL (experimental `grpo_with_replay_buffer`, removed in TRL 1.16 by PR #7132) kept at most
`replay_buffer_size` groups in a min-heap keyed by a score, admitted a new group when the
heap had room or its score beat the lowest stored one (which it then replaced), and sampled
groups with probability proportional to their score, without replacement unless more were
asked for than stored. Sampled groups stay stored. This is that behaviour on `Group` records
(the rollouts themselves, with their behaviour log-probs and stored advantages), with a
seeded numpy generator so a resumed run draws what the uninterrupted one would have.

Not a ledger buffer: it holds references to rollouts that were already trained on (and
counted as consumed by the run's main queue), so its counts are reuse, never generation.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from replayrl.data.buffer.base import (
    SeedLike,
    check_int,
    check_n,
    decode_rollouts,
    encode_rollouts,
    make_rng,
)
from replayrl.data.groups import Group

__all__ = ["ScoredGroupBuffer", "trl_group_score"]


def trl_group_score(group: Group) -> float:
    """TRL's replay score of a group: sum_i |A_i| * std(r), std the group's reward std
    (`(group_advantages.abs() * group_std_rewards).sum(dim=-1)`, with the std repeated per
    member as in TRL). High for groups with large advantages and reward spread; 0 for a group
    without variance."""
    std = group.reward_std
    return float(sum(abs(a) * std for a in group.advantages))


class ScoredGroupBuffer:
    """At most `capacity` groups; the lowest-scored is replaced by a better newcomer.

    `sample(n)`: n groups drawn with probability score / sum(scores), without replacement when
    n <= size, with replacement otherwise (TRL's rule); an empty buffer returns []. Groups with
    a score <= 0 are never admitted (they carry no signal to replay).
    """

    kind = "scored_groups"

    def __init__(self, capacity: int, seed: SeedLike = 0) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        self._rng = make_rng(seed)
        # min-heap of (score, admission ordinal, group): the ordinal breaks score ties (the
        # older group is the one replaced) and keeps groups out of the comparison
        self._heap: list[tuple[float, int, Group]] = []
        self._ordinal = itertools.count()
        self.added = 0  # groups admitted
        self.replaced = 0  # stored groups pushed out by a better one
        self.rejected = 0  # groups not admitted (score too low or <= 0)
        self.sampled = 0  # groups drawn (a group drawn twice counts twice)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, groups: Sequence[Group], scores: Sequence[float]) -> None:
        if len(groups) != len(scores):
            raise ValueError(f"{len(groups)} groups but {len(scores)} scores")
        for g, s in zip(groups, scores, strict=True):
            s = float(s)
            if not s > 0:  # also rejects NaN
                self.rejected += 1
            elif len(self._heap) < self.capacity:
                heapq.heappush(self._heap, (s, next(self._ordinal), g))
                self.added += 1
            elif s > self._heap[0][0]:
                heapq.heapreplace(self._heap, (s, next(self._ordinal), g))
                self.added += 1
                self.replaced += 1
            else:
                self.rejected += 1

    def groups(self) -> list[Group]:
        return [g for _, _, g in self._heap]

    def scores(self) -> list[float]:
        return [s for s, _, _ in self._heap]

    def probabilities(self) -> np.ndarray:
        s = np.asarray(self.scores(), dtype=np.float64)
        return s / s.sum()

    def sample(self, n: int) -> list[Group]:
        n = check_n(n)
        if n == 0 or not self._heap:
            return []
        size = len(self._heap)
        idx = self._rng.choice(size, size=n, replace=n > size, p=self.probabilities())
        self.sampled += n
        return [self._heap[int(i)][2] for i in idx]

    def stats(self) -> dict[str, float]:
        return {
            "size": float(len(self._heap)),
            "capacity": float(self.capacity),
            "added": float(self.added),
            "replaced": float(self.replaced),
            "rejected": float(self.rejected),
            "sampled": float(self.sampled),
        }

    def state_dict(self) -> dict[str, Any]:
        table, order = encode_rollouts(r for _, _, g in self._heap for r in g.rollouts)
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "scores": [s for s, _, _ in self._heap],
            "ordinals": [o for _, o, _ in self._heap],
            "sizes": [len(g) for _, _, g in self._heap],
            "rollouts": table,
            "order": order,
            "next_ordinal": max((o for _, o, _ in self._heap), default=-1) + 1,
            "counters": self.stats(),
            "rng": dict(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("capacity") != self.capacity:
            raise ValueError(
                f"state_dict capacity={state.get('capacity')!r} does not match this buffer's "
                f"capacity={self.capacity}"
            )
        flat = decode_rollouts(state["rollouts"], state["order"])
        heap, at = [], 0
        for s, o, k in zip(state["scores"], state["ordinals"], state["sizes"], strict=True):
            heap.append((float(s), int(o), Group(flat[at : at + int(k)])))
            at += int(k)
        self._heap = heap  # saved in heap order: still a valid heap
        self._ordinal = itertools.count(int(state["next_ordinal"]))
        c = state["counters"]
        self.added, self.replaced = int(c["added"]), int(c["replaced"])
        self.rejected, self.sampled = int(c["rejected"]), int(c["sampled"])
        self._rng.bit_generator.state = state["rng"]
