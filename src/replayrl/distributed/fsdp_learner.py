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
  unsharded LoRA learner writes), gathered one tensor at a time to rank 0's CPU.

AdamW's state (and with kl.beta > 0 the frozen reference) is never gathered for a
checkpoint: every rank writes its own shards of the policy, AdamW and the reference with DCP
into the checkpoint's `learner_shards/` (storage/sharded_checkpoint.py) while rank 0 writes
the rest of the run state, and a resume has every rank load its shards once the ranks are
sharded again. A checkpoint of whole learner state (an unsharded run's, or one written
before sharded checkpoints) still resumes: it is loaded whole and split over the ranks
(`fsdp.shard_learner`).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
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
from replayrl.storage.sharded_checkpoint import (
    SHARDED_DIR,
    is_sharded_checkpoint,
    load_sharded,
    save_sharded,
)

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


def _reference(learner: Learner) -> torch.nn.Module | None:
    """The sharded frozen reference (full fine-tuning with kl.beta > 0), else None."""
    ref = learner.base_model
    return ref if isinstance(ref, torch.nn.Module) else None


def save_learner_shards(learner: Learner, folder: Path) -> None:
    """This rank's shards of the policy, AdamW and reference into `folder` (a collective)."""
    save_sharded(folder, learner.model, learner.optimizer, reference=_reference(learner))


def load_learner_shards(learner: Learner, folder: Path) -> None:
    """This rank's shards from a `save_learner_shards` folder, and its RNG states (a
    collective, once the ranks are sharded)."""
    load_sharded(folder, learner.model, learner.optimizer, reference=_reference(learner))


def sharded_learner_state(learner: Learner) -> dict[str, object]:
    """What a sharded learner's checkpoint keeps in its state file: `learner.state_dict()`
    less AdamW's state (None) and the frozen reference, which are DCP shards."""
    state = learner.state_dict()
    state["optimizer"] = None
    if _reference(learner) is not None:
        del state["base_model"]
    return state


GATHER_TIMEOUT_S = 600.0  # a gather is one collective: a lost rank must not hang rank 0


class ShardedLeader:
    """Rank 0's gathers: each one asks the followers to join, gathers, and waits for them."""

    def __init__(self, learner: Learner, followers: Sequence[Any], ray: ModuleType) -> None:
        # followers: Ray actor handles (FollowerActor in ray_runtime.py), whose `gather`
        # joins this rank's collectives
        self.learner, self.followers, self.ray = learner, followers, ray
        self.gathered: Counter[str] = Counter()  # the gathers run so far, by part

    def _all_ranks(self, what: str, call: Callable[[Any], Any], here: Callable[[], _T]) -> _T:
        """`call(follower)` on every follower while this rank runs `here` (one collective)."""
        refs = [call(f) for f in self.followers]
        out = here()
        try:
            self.ray.get(refs, timeout=GATHER_TIMEOUT_S)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as exc:
            raise RunFailed(f"a sharded learner rank was lost in {what}") from exc
        return out

    def _with_followers(self, part: str, gather: Callable[[], _T]) -> _T:
        self.gathered[part] += 1
        return self._all_ranks(
            f"a gather of the {part}", lambda f: f.gather.remote((part,)), gather
        )

    def save_shards(self, folder: Path) -> None:
        """Every rank writes its shards into `folder` (`save_learner_shards`)."""
        self._all_ranks(
            "a checkpoint's write",
            lambda f: f.save_shards.remote(str(folder)),
            lambda: save_learner_shards(self.learner, folder),
        )

    def load_shards(self, folder: Path) -> None:
        """Every rank loads its shards from `folder` (`load_learner_shards`)."""
        self._all_ranks(
            "a resume's load",
            lambda f: f.load_shards.remote(str(folder)),
            lambda: load_learner_shards(self.learner, folder),
        )

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

    # the session's (declared for this mixin's methods)
    cfg: Config
    learner: Learner
    sharded: ShardedLeader | None = None
    # a resumed sharded checkpoint's DCP folder, loaded by every rank once they are sharded
    pending_shards: Path | None = None

    def shard_outputs(self, leader: ShardedLeader) -> None:
        """From now on publishing, evaluation and checkpoints gather the full policy; a
        resumed checkpoint's shards are loaded by every rank now."""
        self.sharded = leader
        inner = self.pool_factory  # type: ignore[has-type]
        self.pool_factory = lambda s: FullWeightsPool(inner(s), leader)
        if self.pending_shards is not None:
            leader.load_shards(self.pending_shards)
            self.pending_shards = None

    def restore_learner(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Sharded learners resuming a sharded checkpoint: the state file's part now, the
        shards once the ranks are sharded (`shard_outputs`). Any other pairing is the
        session's: whole state loaded whole (sharded later, each rank keeping its part), or
        a sharded checkpoint loaded into an unsharded learner."""
        cfg = self.cfg
        if not (is_sharded(cfg) and cfg.workers.learners > 1 and is_sharded_checkpoint(ckpt)):
            super().restore_learner(ckpt, state)  # type: ignore[misc]
            return
        self.learner.load_state_dict(state)
        self.pending_shards = ckpt / SHARDED_DIR

    def follower_state(self) -> dict[str, Any]:
        """What a resumed run's followers load before they shard: rank 0's learner state,
        less what every rank loads from the shards afterwards."""
        learner = self.learner
        return sharded_learner_state(learner) if self.pending_shards else learner.state_dict()

    def write_learner_shards(self) -> Callable[[Path], None] | None:
        if self.sharded is None:
            return super().write_learner_shards()  # type: ignore[misc]
        leader = self.sharded
        return lambda tmp: leader.save_shards(tmp / SHARDED_DIR)

    def evaluate(self) -> dict[str, float]:
        if self.sharded is None:
            return super().evaluate()  # type: ignore[misc]
        gen = copy.copy(self.generator)  # type: ignore[has-type]
        # the HF model the generator takes (a LoRA policy's with its adapter layers active)
        full = unwrap_model(self.sharded.full_model())
        gen.model = full.to(self.learner.device)
        real, self.generator = self.generator, gen  # type: ignore[has-type]
        try:
            return super().evaluate()  # type: ignore[misc]
        finally:
            self.generator = real

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = super()._state()  # type: ignore[misc]
        if self.sharded is not None:  # AdamW and the reference: every rank's DCP shards
            state["learner"] = sharded_learner_state(self.learner)
        return state

    def checkpoint(self) -> Any:
        """The full policy's HF folder, the run state (`_state`) and every rank's shards
        (`write_learner_shards`)."""
        if self.sharded is None:
            return super().checkpoint()  # type: ignore[misc]
        real, self.model = self.model, self.sharded.full_model()  # type: ignore[has-type]
        try:
            return super().checkpoint()  # type: ignore[misc]
        finally:
            self.model = real
