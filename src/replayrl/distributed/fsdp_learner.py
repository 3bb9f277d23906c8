"""Sharded learners on Ray (`train.sharding: fsdp`, `workers.learners` = T >= 2).

Every learner rank (rank 0 in the learner actor, ranks 1..T-1 in follower actors) shards the
policy, its gradients and its AdamW state with FSDP2 (distributed/fsdp.py) and trains on its
own buffer shard's B / T rollouts, as the data-parallel learners do.

What leaves the learners needs the full weights, and gathering them is a collective: rank 0
asks every follower to join (`gather`) and gathers itself, in the same order on every rank.
- weights for the generators: gathered at every publish (`workers.sync_every`), sent as full
  tensors in the generation dtype (with LoRA only the adapters are gathered and sent, as an
  unsharded LoRA learner sends them);
- an evaluation: gathered into an unsharded copy rank 0 generates with;
- a checkpoint: the full policy as an HF folder (a LoRA policy's adapter folder, as an
  unsharded LoRA learner writes), and the AdamW state gathered into an unsharded optimizer's
  layout (with kl.beta > 0, the frozen reference gathered too). A resume loads both into the
  unsharded learners, which are then sharded again, each rank keeping its part
  (`fsdp.shard_learner`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

import torch

from replayrl.config.schema import Config
from replayrl.distributed import fsdp
from replayrl.distributed.ddp import data_parallel_ranks
from replayrl.errors import RunFailed
from replayrl.learner.frozen import is_lora
from replayrl.learner.learner import Learner
from replayrl.models.loading import unwrap_model

_T = TypeVar("_T")

# the collectives a follower joins, by name; rank 0 runs the same function in the same order
_PARTS = ("model", "adapters", "optimizer")


def is_sharded(cfg: Config) -> bool:
    return cfg.train.sharding == "fsdp"


def join_learners(learner: Learner, world: int) -> None:
    """Make `learner` one of `world` learner ranks (the process group joined): sharded under
    `train.sharding: fsdp` (its policy sharded in place, then it joins the sharded ranks),
    else a data-parallel replica. Every rank calls it at once."""
    if is_sharded(learner.cfg):
        fsdp.shard_learner(learner, world)
    else:
        learner.join(data_parallel_ranks(world))


def follow_gather(learner: Learner, parts: tuple[str, ...]) -> None:
    """A follower's side of rank 0's gathers: the same collectives, the results dropped."""
    for part in parts:
        if part == "model":
            fsdp.full_state(learner.model)
        elif part == "adapters":
            fsdp.full_trainable(learner.model)
        elif part == "optimizer":
            fsdp.full_learner_state(learner)
        else:
            raise ValueError(f"unknown gather {part!r} (known: {_PARTS})")


GATHER_TIMEOUT_S = 600.0  # a gather is one collective: a lost rank must not hang rank 0


class ShardedLeader:
    """Rank 0's gathers: each one asks the followers to join, gathers, and waits for them."""

    def __init__(self, learner: Learner, followers: Sequence[Any], ray: ModuleType) -> None:
        # followers: Ray actor handles (FollowerActor in ray_runtime.py), whose `gather`
        # joins this rank's collectives
        self.learner, self.followers, self.ray = learner, followers, ray

    def _with_followers(self, part: str, gather: Callable[[], _T]) -> _T:
        refs = [f.gather.remote((part,)) for f in self.followers]
        out = gather()
        try:
            self.ray.get(refs, timeout=GATHER_TIMEOUT_S)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as exc:
            raise RunFailed(f"a sharded learner rank was lost in a gather of the {part}") from exc
        return out

    def full_model(self) -> torch.nn.Module:
        """An unsharded CPU copy of the policy (one all-gather over the ranks)."""
        return self._with_followers("model", lambda: fsdp.full_model(self.learner.model))

    def sync_model(self) -> torch.nn.Module:
        """What a weight sync sends from: the full policy, or for LoRA a copy holding only the
        gathered adapters (a sync sends the adapters; the base is frozen)."""
        if is_lora(self.learner.model):
            return self._with_followers("adapters", lambda: fsdp.adapters_model(self.learner.model))
        return self.full_model()

    def full_learner_state(self) -> dict[str, object]:
        """The learner's state with the AdamW state gathered (`fsdp.full_learner_state`)."""
        return self._with_followers("optimizer", lambda: fsdp.full_learner_state(self.learner))


class FullWeightsPool:
    """A generator pool whose `publish` sends the gathered full weights, not rank 0's shard;
    everything else is the wrapped pool's."""

    def __init__(self, pool: Any, leader: ShardedLeader) -> None:
        self.pool, self.leader = pool, leader

    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.pool.publish(self.leader.sync_model(), version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class ShardedSession:
    """Rank 0's session methods that need the full policy when the learners are sharded
    (`sharded` set once the ranks are sharded); with `sharded` None they are the session's."""

    sharded: ShardedLeader | None = None

    def shard_outputs(self, leader: ShardedLeader) -> None:
        """From now on publishing, evaluation and checkpoints gather the full policy."""
        self.sharded = leader
        inner = self.pool_factory  # type: ignore[has-type]
        self.pool_factory = lambda s: FullWeightsPool(inner(s), leader)

    def evaluate(self) -> dict[str, float]:
        if self.sharded is None:
            return super().evaluate()  # type: ignore[misc]
        gen = copy.copy(self.generator)  # type: ignore[has-type]
        # the HF model the generator takes (a LoRA policy's with its adapter layers active)
        full = unwrap_model(self.sharded.full_model())
        gen.model = full.to(self.learner.device)  # type: ignore[attr-defined]
        real, self.generator = self.generator, gen  # type: ignore[has-type]
        try:
            return super().evaluate()  # type: ignore[misc]
        finally:
            self.generator = real

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = super()._state()  # type: ignore[misc]
        if self.sharded is not None:
            state["learner"] = self.sharded.full_learner_state()
        return state

    def checkpoint(self) -> Any:
        """The full policy's HF folder and the gathered learner state (`_state`)."""
        if self.sharded is None:
            return super().checkpoint()  # type: ignore[misc]
        real, self.model = self.model, self.sharded.full_model()  # type: ignore[has-type]
        try:
            return super().checkpoint()  # type: ignore[misc]
        finally:
            self.model = real
