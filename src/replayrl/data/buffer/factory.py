"""``make_buffer``: one entry point for every buffer kind, with argument checking."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replayrl.data.buffer.base import Buffer, check_int, check_max_staleness
from replayrl.data.buffer.onpolicy import OnPolicyQueue
from replayrl.data.buffer.replay import ReplayBuffer
from replayrl.data.buffer.samplers import DEFAULT_SAMPLER, sampler_spec
from replayrl.data.buffer.sharded import ShardedBuffer

__all__ = ["make_buffer"]

# the factory's own vocabulary; which kind a run uses is its method's (`MethodSpec.buffer`)
_KINDS = ("replay", "onpolicy")


def make_buffer(
    kind: str,
    capacity: int | None,
    *,
    sampler: str = "uniform",
    delta: float = 0.0,
    with_replacement: bool = False,
    num_shards: int = 1,
    max_staleness: int | None = None,
    seed: int = 0,
) -> Buffer:
    """Build a buffer.

    ``kind``: "replay" (FIFO, uniform or positive-bias sampling, items kept) or "onpolicy"
    (LIFO, freshest first, items removed). ``capacity`` is the total N (required for replay;
    ``None`` = unbounded for onpolicy). ``sampler="positive_bias"`` with ``delta``: paper 1's
    "freshest (1-delta)N plus freshest delta*N correct rollouts not already among them" (a
    window of N - k and a correct reserve of k = floor(delta*N), see :class:`ReplayBuffer`).
    With ``num_shards = T > 1`` the result is a :class:`ShardedBuffer` of T shards of capacity
    N // T (T must divide N; each shard applies the rule to its own N // T); with T = 1 it is
    the plain buffer. Shard ``i`` gets the seed ``SeedSequence(seed).spawn(T + 1)[i + 1]`` and
    the router the first child. Every bad argument raises ``ValueError`` naming it.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r}: unknown buffer kind; expected one of {_KINDS}")
    if capacity is None:
        if kind == "replay":
            raise ValueError("capacity=None: a replay buffer needs an int capacity >= 1")
    else:
        capacity = check_int("capacity", capacity, 1)
    spec = sampler_spec(sampler)
    sampler_key = sampler.replace("-", "_")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or math.isnan(delta):
        raise ValueError(f"delta={delta!r}: must be a float in [0, 1)")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta={delta!r}: must be in [0, 1)")
    if not spec.uses_delta and delta != 0.0:
        raise ValueError(f"delta={delta!r}: not used by sampler={sampler!r}")
    if not isinstance(with_replacement, bool):
        raise ValueError(f"with_replacement={with_replacement!r}: must be a bool")
    num_shards = check_int("num_shards", num_shards, 1)
    max_staleness = check_max_staleness(max_staleness)
    seed = check_int("seed", seed, 0)
    if kind == "onpolicy":
        if sampler_key != DEFAULT_SAMPLER:
            raise ValueError(f"sampler={sampler!r}: kind='onpolicy' is LIFO and takes no sampler")
        if with_replacement:
            raise ValueError("with_replacement=True: kind='onpolicy' removes what it returns")
    if capacity is not None and capacity % num_shards:
        raise ValueError(
            f"num_shards={num_shards}: must divide capacity={capacity} (shards hold N // T each)"
        )

    def build(shard_capacity: int | None, shard_seed: Any) -> ReplayBuffer | OnPolicyQueue:
        if kind == "replay":
            assert shard_capacity is not None
            return ReplayBuffer(
                shard_capacity,
                sampler=sampler_key,
                delta=float(delta),
                with_replacement=with_replacement,
                max_staleness=max_staleness,
                seed=shard_seed,
            )
        return OnPolicyQueue(shard_capacity, max_staleness=max_staleness, seed=shard_seed)

    if num_shards == 1:
        return build(capacity, seed)
    seeds = np.random.SeedSequence(seed).spawn(num_shards + 1)
    per = None if capacity is None else capacity // num_shards
    return ShardedBuffer([build(per, s) for s in seeds[1:]], seed=seeds[0])
