"""Samplers: pure functions that say which stored rollouts may be drawn, and how to draw.

A buffer stores rollouts in push order. Positions are *offsets*: 0 is the oldest stored
rollout, ``size - 1`` the freshest. A sampler maps ``(size, capacity, correct_before)`` to a
:class:`CandidateSet`; it never touches the rollouts themselves, so it is O(log N) at most and
trivially testable. ``correct_before(o)`` is the number of stored *correct* rollouts whose
offset is ``< o`` (the buffer answers it with a binary search over an index of correct items).

The candidate set always has the shape used by paper 1 (papers.md, section 1):

* a *fresh window*: every stored rollout with offset in ``[fresh_start, size)``, plus
* *extras*: the freshest ``n_extra`` correct rollouts among those older than the window.

Candidates are then drawn uniformly with :func:`draw_indices`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "SAMPLER_NAMES",
    "CandidateSet",
    "PositiveBias",
    "Sampler",
    "draw_indices",
    "make_sampler",
    "num_reserved",
    "positive_bias",
    "uniform",
]

CorrectBefore = Callable[[int], int]


@dataclass(frozen=True)
class CandidateSet:
    """Offsets ``[fresh_start, size)`` plus the freshest ``n_extra`` correct items older than it.

    ``n_correct_older`` is ``correct_before(fresh_start)``: the extras are the correct items of
    ranks ``[n_correct_older - n_extra, n_correct_older)`` (rank 0 = oldest correct item).
    """

    size: int
    fresh_start: int
    n_extra: int = 0
    n_correct_older: int = 0

    @property
    def n_fresh(self) -> int:
        return self.size - self.fresh_start

    @property
    def first_extra_rank(self) -> int:
        return self.n_correct_older - self.n_extra

    def __len__(self) -> int:
        return self.n_fresh + self.n_extra


class Sampler(Protocol):
    """Maps the buffer's shape to the set of rollouts that may be drawn."""

    @property
    def name(self) -> str: ...

    def __call__(
        self, size: int, capacity: int, correct_before: CorrectBefore | None = None
    ) -> CandidateSet: ...


class _Uniform:
    name = "uniform"
    delta = 0.0

    def __call__(
        self, size: int, capacity: int, correct_before: CorrectBefore | None = None
    ) -> CandidateSet:
        """Paper 1 replay buffer: uniform over every stored rollout (the freshest N)."""
        return CandidateSet(size=size, fresh_start=0)

    def __repr__(self) -> str:
        return "uniform"


uniform: Sampler = _Uniform()
"""Paper 1 (papers.md s.1): ``sample(B)`` draws uniformly from all N stored rollouts."""


def num_reserved(delta: float, capacity: int) -> int:
    """Slots of the positive-bias candidate set kept for older correct rollouts: floor(delta*N)."""
    # The epsilon stops 0.29 * 100 = 28.999999999999996 from flooring to 28.
    return min(capacity, math.floor(delta * capacity + 1e-9))


@dataclass(frozen=True)
class PositiveBias:
    """Paper 1 positive-bias sampling: freshest (1-delta)N plus freshest delta*N correct others.

    Interpretation (N = the buffer's capacity, also while it is not yet full):

    * ``k = floor(delta * N)`` and the fresh window is the freshest ``N - k`` stored rollouts
      (all of them while ``size <= N - k``);
    * the extras are the freshest ``k`` *correct* stored rollouts older than the window.

    The buffer is a plain FIFO of capacity N, so nothing evicted from it is retained: the
    region older than the window holds at most ``k`` rollouts, and the extras are therefore
    exactly the correct ones among them (the "freshest k" cap never binds inside one FIFO; it is
    kept so the function is right for any caller). The incorrect rollouts in that region are
    stored but never drawn, so the candidate set has between ``N - k`` and ``N`` members.
    ``delta = 0`` gives ``k = 0``: uniform over the freshest N, identical to :data:`uniform`.
    """

    delta: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.delta < 1.0) or math.isnan(self.delta):
            raise ValueError(f"delta={self.delta!r}: must be in [0, 1)")

    @property
    def name(self) -> str:
        return "positive_bias"

    def __call__(
        self, size: int, capacity: int, correct_before: CorrectBefore | None = None
    ) -> CandidateSet:
        """Paper 1 positive bias: candidates = freshest (1-delta)N + freshest delta*N correct."""
        k = num_reserved(self.delta, capacity)
        fresh_start = max(0, size - (capacity - k))
        if fresh_start == 0 or k == 0:
            return CandidateSet(size=size, fresh_start=fresh_start)
        if correct_before is None:
            raise ValueError("positive_bias needs correct_before to find older correct items")
        n_older = correct_before(fresh_start)
        return CandidateSet(
            size=size, fresh_start=fresh_start, n_extra=min(k, n_older), n_correct_older=n_older
        )


def positive_bias(delta: float) -> PositiveBias:
    """Paper 1 (papers.md s.1) positive-bias sampler with parameter delta in [0, 1)."""
    return PositiveBias(float(delta))


SAMPLER_NAMES = ("uniform", "positive_bias")


def make_sampler(name: str, delta: float = 0.0) -> Sampler:
    """Sampler by name ("uniform" or "positive_bias"; "positive-bias" is accepted too)."""
    key = name.replace("-", "_") if isinstance(name, str) else name
    if key == "uniform":
        if delta != 0.0:
            raise ValueError(
                f"delta={delta!r}: only used by sampler='positive_bias' (sampler is 'uniform')"
            )
        return uniform
    if key == "positive_bias":
        return positive_bias(delta)
    raise ValueError(f"sampler={name!r}: unknown sampler; expected one of {SAMPLER_NAMES}")


def draw_indices(rng: np.random.Generator, m: int, n: int, replace: bool) -> np.ndarray:
    """Uniform draw of candidate indices in ``[0, m)`` (paper 1: ``sample(B)`` is uniform).

    With ``replace`` it returns ``n`` i.i.d. indices (``m`` must be > 0 unless ``n == 0``).
    Without it, ``min(n, m)`` distinct indices in random order: asking for more than there are
    returns every candidate once, shuffled.
    """
    if n <= 0 or m <= 0:
        return np.empty(0, dtype=np.int64)
    if replace:
        return rng.integers(0, m, size=n, dtype=np.int64)
    return rng.choice(m, size=min(n, m), replace=False).astype(np.int64, copy=False)
