"""What every pass of the learner reads: the config, the device, the forward's precision and
how this learner works with other learner ranks.

One `LearnerContext`, owned by the `Learner` and shared by its passes (batch assembly, the
frozen passes, the policy pass, the critic pass): a run that changes the config (the `auto`
design, per-rank mini-batches) or joins other ranks (`Learner.join`) changes it once, and
every pass reads the new value at its next use, as one object's attributes would be read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from replayrl.algorithms.aggregation import Reducer
from replayrl.config.schema import Config
from replayrl.learner.batching import TokenRows
from replayrl.learner.logprobs import token_logprobs


@dataclass(frozen=True)
class Ranks:
    """How a learner works with the other learner ranks (the default: alone).

    Data-parallel ranks (run/distributed/ddp.py) average gradients and sum the loss normaliser's
    count over ranks; sharded ones (run/distributed/fsdp.py) also run every forward in lockstep,
    since each is a collective.
    """

    world_size: int = 1
    # averages gradients over ranks before clipping (every rank, same parameter order)
    grad_hook: Callable[[list[torch.nn.Parameter]], None] | None = None
    # sums a number over ranks: the loss normaliser's count (token_mean over all ranks' tokens),
    # PPO's advantage whitening statistics
    count_reducer: Reducer | None = None
    # sharded: the most micro-batches any rank has (each rank runs that many, idle ones after)
    micro_count_sync: Callable[[int], int] | None = None
    # sharded: a pass that one rank's rows ask for (stale rows' Mix-PPG anchors) runs on all
    lockstep_forwards: bool = False


@dataclass
class LearnerContext:
    """The run-wide settings the learner's passes read at each use."""

    cfg: Config
    device: torch.device  # where batches go: the policy's parameters' device
    autocast: torch.dtype | None  # the learner's autocast dtype (None: none)
    full_logprobs: bool  # train.logprobs_impl=full: log-probs from full-vocabulary logits
    ranks: Ranks = field(default_factory=Ranks)

    def logprobs(
        self, model: object, batch: TokenRows, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log pi(token) and entropy of `batch`'s completions under `model`, at the
        rollouts' temperature and the learner's precision."""
        return token_logprobs(
            model,
            batch,
            self.cfg.rollout.temperature,
            entropy_grad=entropy_grad,
            autocast=self.autocast,
            full=self.full_logprobs,
        )
