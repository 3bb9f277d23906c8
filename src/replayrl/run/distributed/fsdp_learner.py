"""Sharded learners on Ray (`train.sharding: fsdp`, `workers.learners` = T >= 2).

Every learner rank (rank 0 in the learner actor, ranks 1..T-1 in follower actors) shards the
policy, its gradients and its AdamW state with FSDP2 (run/distributed/fsdp.py) and trains on its
own buffer shard's B / T rollouts, as the data-parallel learners do.

What leaves the learners needs the full weights, and gathering them is a collective: rank 0
asks every follower to join (`gather`) and gathers itself, in the same order on every rank.
- weights for the generators: gathered at every publish (`workers.sync_every`), sent as full
  tensors in the generation dtype (with LoRA only the adapters are gathered and sent, as an
  unsharded LoRA learner sends them);
- an evaluation: the weights published to the generators, and generator 0 evaluates them
  (ray_runtime.py: the learners hold no whole policy, on no device);
- a checkpoint: the full policy as an HF folder (a LoRA policy's adapter folder, as an
  unsharded LoRA learner writes), gathered one tensor at a time to rank 0's CPU.

AdamW's state (and with kl.beta > 0 the frozen reference, and PPO's critic with its AdamW
state) is never gathered for a checkpoint: every rank writes its own shards of all of them
with DCP
into the checkpoint's `learner_shards/` (storage/sharded_checkpoint.py) while rank 0 writes
the rest of the run state, and a resume has every rank load its shards once the ranks are
sharded again. A checkpoint of whole learner state (an unsharded run's, or one written
before sharded checkpoints) still resumes: it is loaded whole and split over the ranks
(`fsdp.shard_learner`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch

from replayrl.config.schema import Config
from replayrl.errors import RunFailed
from replayrl.learner.frozen import is_lora
from replayrl.learner.learner import Learner
from replayrl.models.precision import choose_for
from replayrl.run.distributed import fsdp
from replayrl.run.distributed.ddp import data_parallel_ranks
from replayrl.run.session import Log, WholeLearner
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


def critic_of(learner: Learner) -> tuple[torch.nn.Module, Any] | None:
    """PPO's critic and its optimizer (algorithm.advantage = gae), else None."""
    p = learner.critic_pass
    return (p.critic, p.optimizer) if p is not None else None


def save_learner_shards(learner: Learner, folder: Path) -> None:
    """This rank's shards of the policy, AdamW, the reference and the critic into `folder`
    (a collective)."""
    save_sharded(folder, learner.model, learner.optimizer, *_frozen_and_critic(learner))


def load_learner_shards(learner: Learner, folder: Path) -> None:
    """This rank's shards from a `save_learner_shards` folder, and its RNG states (a
    collective, once the ranks are sharded)."""
    ref, critic = _frozen_and_critic(learner)
    load_sharded(folder, learner.model, learner.optimizer, reference=ref, critic=critic)


def _frozen_and_critic(
    learner: Learner,
) -> tuple[torch.nn.Module | None, tuple[torch.nn.Module, Any] | None]:
    return _reference(learner), critic_of(learner)


def sharded_learner_state(learner: Learner) -> dict[str, object]:
    """What a sharded learner's checkpoint keeps in its state file: `learner.state_dict()`
    less AdamW's state (None), the frozen reference and the critic, which are DCP shards."""
    state = learner.state_dict()
    state["optimizer"] = None
    if _reference(learner) is not None:
        del state["base_model"]
    state.pop("critic", None)
    state.pop("critic_optimizer", None)
    return state


GATHER_TIMEOUT_S = 600.0  # a gather is one collective: a lost rank must not hang rank 0
_POLL_S = 0.5  # how often rank 0 looks at the followers while it waits in a collective


class ShardedLeader:
    """Rank 0's gathers: each one asks the followers to join, gathers, and waits for them."""

    def __init__(self, learner: Learner, followers: Sequence[Any], ray: ModuleType) -> None:
        # followers: Ray actor handles (FollowerActor in ray_runtime.py), whose `gather`
        # joins this rank's collectives
        self.learner, self.followers, self.ray = learner, followers, ray
        self.gathered: Counter[str] = Counter()  # the gathers run so far, by part

    def _all_ranks(self, what: str, call: Callable[[Any], Any], here: Callable[[], _T]) -> _T:
        """`call(follower)` on every follower while this rank runs `here` (one collective).

        `here` runs in a thread while this one watches the followers: a follower that fails
        before it joins the collective (a full disk, an unwritable folder, a lost actor)
        would leave `here` waiting for it until the process group's timeout, so its error
        ends the run at once, naming the rank, instead of after minutes of silence."""
        refs = {call(f): rank for rank, f in enumerate(self.followers, start=1)}
        mine: dict[str, Any] = {}
        device = self.learner.device

        def run_here() -> None:
            if device.type == "cuda":  # the CUDA device is per thread
                torch.cuda.set_device(device)
            try:
                mine["out"] = here()
            except BaseException as exc:  # handed to the watching thread
                mine["error"] = exc

        thread = threading.Thread(target=run_here, name=f"rank 0: {what}", daemon=True)
        thread.start()
        pending, deadline = list(refs), time.monotonic() + GATHER_TIMEOUT_S
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=_POLL_S)
            for ref in ready:
                self._check(ref, refs[ref], what)
            if "error" in mine:  # rank 0 failed: the followers would wait for it in vain
                raise mine["error"]
            if time.monotonic() > deadline:
                ranks = sorted(refs[r] for r in pending)
                raise RunFailed(
                    f"sharded learner rank(s) {ranks} did not finish {what} in "
                    f"{GATHER_TIMEOUT_S:.0f} s"
                )
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise RunFailed(f"rank 0 did not finish {what} in {GATHER_TIMEOUT_S:.0f} s")
        if "error" in mine:
            raise mine["error"]
        return mine["out"]

    def _check(self, ref: Any, rank: int, what: str) -> None:
        """A follower's finished part of a collective: its error ends the run."""
        try:
            self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            raise RunFailed(f"sharded learner rank {rank} was lost in {what}") from exc
        except self.ray.exceptions.RayError as exc:
            raise RunFailed(f"sharded learner rank {rank} failed in {what}: {exc}") from exc

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

    def full_model(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """An unsharded CPU copy of the policy (one all-gather over the ranks), in `dtype`
        (None: the master weights' own)."""
        return self._with_followers("model", lambda: fsdp.full_model(self.learner.model, dtype))

    def sync_model(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """What a weight sync sends from: the full policy in `dtype`, or for LoRA a copy
        holding only the gathered adapters (a sync sends the adapters; the base is frozen)."""
        if is_lora(self.learner.model):
            return self._with_followers("adapters", lambda: fsdp.adapters_model(self.learner.model))
        return self.full_model(dtype)

    def sync_dtype(self) -> torch.dtype:
        """The dtype weights leave the learners in: the generation dtype as the learners'
        own policy decides it (its device and size under `precision.generation`), not as the
        gathered host copy would (a host CPU without bf16 would send fp32)."""
        model = self.learner.model
        chosen = choose_for(self.learner.cfg.precision, model).generation
        return chosen if chosen is not None else next(model.parameters()).dtype

    def full_learner_state(self) -> dict[str, object]:
        """The learner's state with the AdamW state gathered (`fsdp.full_learner_state`)."""
        return self._with_followers("optimizer", lambda: fsdp.full_learner_state(self.learner))


class FullWeightsPool:
    """A generator pool whose `publish` sends the gathered full weights, not rank 0's shard;
    everything else is the wrapped pool's."""

    def __init__(self, pool: Any, leader: ShardedLeader) -> None:
        self.pool, self.leader = pool, leader

    def publish(self, model: torch.nn.Module, version: int) -> None:
        dtype = self.leader.sync_dtype()
        self.pool.publish(self.leader.sync_model(dtype), version, dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class ShardedOutputs(WholeLearner):
    """Rank 0's reading of sharded learners (`leader` set once the ranks are sharded):
    checkpoints and publishing gather the full policy (evaluation is a generator's), and
    every rank writes and loads its own DCP shards of AdamW and the reference. Before the
    ranks are sharded (and on a run whose ranks never shard) it reads the learner whole."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.leader: ShardedLeader | None = None
        # a resumed sharded checkpoint's DCP folder, loaded by every rank once they are sharded
        self.pending_shards: Path | None = None

    def shard(self, leader: ShardedLeader) -> None:
        """From now on evaluation and checkpoints gather the full policy; a resumed
        checkpoint's shards are loaded by every rank now."""
        self.leader = leader
        if self.pending_shards is not None:
            leader.load_shards(self.pending_shards)
            self.pending_shards = None

    def restore(self, learner: Learner, ckpt: Path, state: dict[str, Any], log: Log) -> None:
        """Sharded learners resuming a sharded checkpoint: the state file's part now, the
        shards once the ranks are sharded (`shard`). Any other pairing is the whole
        learner's: whole state loaded whole (sharded later, each rank keeping its part), or a
        sharded checkpoint loaded into an unsharded learner."""
        cfg = self.cfg
        if not (is_sharded(cfg) and cfg.workers.learners > 1 and is_sharded_checkpoint(ckpt)):
            super().restore(learner, ckpt, state, log)
            return
        learner.load_state_dict(state)
        self.pending_shards = ckpt / SHARDED_DIR

    def follower_state(self, learner: Learner) -> dict[str, Any]:
        """What a resumed run's followers load before they shard: rank 0's learner state,
        less what every rank loads from the shards afterwards."""
        return sharded_learner_state(learner) if self.pending_shards else learner.state_dict()

    def learner_state(self, learner: Learner) -> dict[str, Any]:
        if self.leader is None:
            return super().learner_state(learner)
        return sharded_learner_state(learner)  # AdamW and the reference: the ranks' shards

    def shard_writer(self) -> Callable[[Path], None] | None:
        leader = self.leader
        if leader is None:
            return super().shard_writer()
        return lambda tmp: leader.save_shards(tmp / SHARDED_DIR)

    def policy_to_save(self, model: torch.nn.Module) -> torch.nn.Module:
        """The full policy, gathered one tensor at a time to rank 0's CPU."""
        return model if self.leader is None else self.leader.full_model()
