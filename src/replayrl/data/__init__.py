"""Rollouts at rest: the Rollout record, the buffers (FIFO replay, on-policy, sharded), the batch
sources the loops draw from (fresh, ReMix window) and the design rule that sizes a buffer."""
