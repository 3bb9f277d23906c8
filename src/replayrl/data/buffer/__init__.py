"""Rollout stores for RL post-training with experience replay (arXiv 2604.08706).

* :class:`ReplayBuffer` ("replay"): FIFO of capacity N, sampled uniformly, sampled rollouts
  stay stored. With positive bias (delta) it is a fresh window of N - k plus a reserve of the
  k = floor(delta*N) freshest correct rollouts that left it, the paper's rule "freshest
  (1-delta)N plus freshest delta*N correct rollouts not already among them".
* :class:`OnPolicyQueue` ("onpolicy"): the on-policy baseline, LIFO, rollouts removed once used.
* :class:`ShardedBuffer`: T shards of N // T, round-robin routing, one shard per trainer.
* :func:`make_buffer`: the factory; :func:`batch_stats`: per-batch age/diversity/reuse metrics.
"""

from replayrl.data.buffer.base import Buffer, rollout_from_dict, rollout_to_dict
from replayrl.data.buffer.factory import make_buffer
from replayrl.data.buffer.metrics import batch_stats
from replayrl.data.buffer.onpolicy import OnPolicyQueue
from replayrl.data.buffer.replay import ReplayBuffer
from replayrl.data.buffer.samplers import (
    PositiveBias,
    Sampler,
    draw_indices,
    make_sampler,
    positive_bias,
    uniform,
)
from replayrl.data.buffer.sharded import ShardedBuffer

__all__ = [
    "Buffer",
    "OnPolicyQueue",
    "PositiveBias",
    "ReplayBuffer",
    "Sampler",
    "ShardedBuffer",
    "batch_stats",
    "draw_indices",
    "make_buffer",
    "make_sampler",
    "positive_bias",
    "rollout_from_dict",
    "rollout_to_dict",
    "uniform",
]
