"""Samplers: how a replay buffer of capacity N splits its storage, and how it draws.

Paper 1 (arXiv 2604.08706) samples *uniformly* from a candidate set; the two samplers
differ only in what the buffer keeps:

* :data:`uniform`: one FIFO of the freshest N rollouts; all of them are candidates.
* :class:`PositiveBias` (``delta``): "sample uniformly from the freshest (1-delta)N rollouts
  plus the freshest delta*N correct rollouts not already among them". The buffer keeps a
  *fresh window* (FIFO of capacity ``N - k``, ``k = floor(delta*N)``) and a *correct reserve*
  (FIFO of capacity ``k``) that receives each correct rollout as it leaves the window.

So a sampler is just the reserve size ``k`` for a capacity ``N``
(:meth:`Sampler.reserve_capacity`); every stored rollout is a candidate, drawn with
:func:`draw_indices`. The rule itself is implemented by
:class:`replayrl.data.buffer.replay.ReplayBuffer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from replayrl.config.registries import SAMPLERS, SamplerSpec

__all__ = [
    "DEFAULT_SAMPLER",
    "PositiveBias",
    "Sampler",
    "draw_indices",
    "make_sampler",
    "num_reserved",
    "sampler_spec",
    "positive_bias",
    "uniform",
]


class Sampler(Protocol):
    """Says how many of a buffer's N slots form the correct reserve (the rest: fresh window)."""

    @property
    def name(self) -> str: ...

    @property
    def delta(self) -> float: ...

    def reserve_capacity(self, capacity: int) -> int:
        """``k``: slots for correct rollouts that left the fresh window (0 <= k < capacity)."""
        ...


class _Uniform:
    name = "uniform"
    delta = 0.0

    def reserve_capacity(self, capacity: int) -> int:
        """Paper 1 replay buffer: no reserve, uniform over the freshest N rollouts."""
        return 0

    def __repr__(self) -> str:
        return "uniform"


uniform: Sampler = _Uniform()
"""Paper 1 (arXiv 2604.08706): ``sample(B)`` draws uniformly from all N stored rollouts."""


def num_reserved(delta: float, capacity: int) -> int:
    """Correct-reserve capacity ``k = floor(delta * N)``, at most ``N - 1``.

    The cap keeps at least one fresh slot (it only binds for delta within 1e-9 / N of 1); the
    epsilon stops 0.29 * 100 = 28.999999999999996 from flooring to 28.
    """
    return max(0, min(capacity - 1, math.floor(delta * capacity + 1e-9)))


@dataclass(frozen=True)
class PositiveBias:
    """Paper 1 positive bias: freshest (1-delta)N plus freshest delta*N correct not among them.

    With ``N`` the buffer's capacity and ``k = floor(delta * N)`` (:func:`num_reserved`):

    * the *fresh window* is a FIFO holding the freshest ``N - k`` rollouts pushed;
    * the *correct reserve* is a FIFO of capacity ``k``: a rollout pushed out of the window
      enters it if it is correct (the reserve's oldest is evicted when it is full) and is
      evicted otherwise. The reserve therefore holds the freshest ``k`` correct rollouts that
      are not in the window.

    Candidates are window + reserve (at most N), drawn uniformly. ``delta = 0`` gives
    ``k = 0``: exactly :data:`uniform`. Stale rollouts (``max_staleness``) are removed from
    both parts; nothing moves back into the window to replace them.
    """

    delta: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.delta < 1.0) or math.isnan(self.delta):
            raise ValueError(f"delta={self.delta!r}: must be in [0, 1)")

    @property
    def name(self) -> str:
        return "positive_bias"

    def reserve_capacity(self, capacity: int) -> int:
        """Paper 1 positive bias: ``k = floor(delta * N)`` slots for older correct rollouts."""
        return num_reserved(self.delta, capacity)


def positive_bias(delta: float) -> PositiveBias:
    """Paper 1 (arXiv 2604.08706) positive-bias sampler with parameter delta in [0, 1)."""
    return PositiveBias(float(delta))


# what an on-policy queue (LIFO, no reserve) is compatible with
DEFAULT_SAMPLER = "uniform"

SAMPLERS.add(
    "uniform",
    SamplerSpec(
        lambda delta: uniform, summary="uniform over the freshest N rollouts (arXiv 2604.08706)"
    ),
)
SAMPLERS.add(
    "positive_bias",
    SamplerSpec(
        positive_bias,
        uses_delta=True,
        summary="a share delta of the buffer reserved for rewarded rollouts (arXiv 2604.08706)",
    ),
)


def sampler_spec(name: str) -> SamplerSpec:
    """The registered sampler `name` ("positive-bias" is read as "positive_bias"); an
    unknown name is a ValueError naming it and the registered ones."""
    key = name.replace("-", "_") if isinstance(name, str) else name
    if key not in SAMPLERS:
        raise ValueError(f"sampler={name!r}: unknown sampler; expected one of {tuple(SAMPLERS)}")
    return SAMPLERS.get(key)


def make_sampler(name: str, delta: float = 0.0) -> Sampler:
    """Sampler by its registered name (`SAMPLERS`: uniform, positive_bias, ...)."""
    spec = sampler_spec(name)
    if not spec.uses_delta and delta != 0.0:
        raise ValueError(f"delta={delta!r}: not used by sampler={name!r}")
    return spec.build(delta)


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
