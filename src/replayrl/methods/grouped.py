"""The base class of the group-level sources (methods/group_sources.py, ar3po.py,
exgrpo.py, repo.py): what each of them needs from the run, done once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from replayrl.data.buffer import Buffer
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import LearnerPort, Production
from replayrl.methods.buffer import BufferSource, Log

__all__ = ["GroupCounters", "GroupSource", "Production", "RngState", "Stateful"]


class GroupCounters(Protocol):
    """The run's counters a group source reads and adds to (`replayrl.run.state.Counters`)."""

    step: int
    reincarnation_step: int | None
    generation_seconds: float

    def account(self, p: Any) -> None: ...
    def add(self, name: str, n: int) -> None: ...
    def retire(self, buffer: Any) -> int: ...


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GroupSource(BufferSource):
    """What the group-level sources (DAPO's dynamic sampling, group replay, AR3PO, ExGRPO,
    RePO) share: they size each step's batch themselves from the step's fresh groups (no
    batch size of their own), bind the run's counters and learner before each step, train
    fresh rollouts through the run's on-policy queue, account extra generation calls as the
    loop accounts its first, and checkpoint their own parts (`parts`) beside the queue."""

    def __init__(self, buffer: Buffer, epochs: int) -> None:
        super().__init__(buffer, 0, epochs)
        self.counters: GroupCounters | None = None
        self.learner: LearnerPort | None = None
        self.log: Log = print

    def before_step(self, learner: LearnerPort, counters: Any, log: Log) -> None:
        self.learner, self.counters, self.log = learner, counters, log

    @property
    def bound(self) -> GroupCounters:
        """The run's counters (`before_step` binds them)."""
        assert self.counters is not None, "before_step binds the counters"
        return self.counters

    def train_fresh(self, fresh: list[Rollout], version: int) -> list[Rollout]:
        """Fresh rollouts through the on-policy queue (pushed, then all of them consumed), so
        the rollout ledger sees each one generated once and trained."""
        self.buffer.push(fresh)
        return self.buffer.sample(len(fresh), current_version=version)

    def generate(self, call: Callable[[], Production]) -> Production:
        """One extra generation call of this step, accounted like the loop's first: its
        rollouts generated, its time as generation time less the time in reward functions,
        one more generation round (`generation_rounds`: a source that calls this declares
        that counter in its registry entry)."""
        c = self.bound
        t0 = time.perf_counter()
        p = call()
        c.account(p)
        c.generation_seconds += max(0.0, time.perf_counter() - t0 - p.reward_seconds)
        c.add("generation_rounds", 1)
        return p

    def parts(self) -> dict[str, Stateful | None]:
        """This source's checkpointed parts beside the queue, by checkpoint key (None: a part
        this configuration does not keep; saved as None)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        own = {k: None if v is None else v.state_dict() for k, v in self.parts().items()}
        return {**super().state_dict(), **own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for key, part in self.parts().items():
            if part is not None and state.get(key) is not None:
                part.load_state_dict(state[key])


class RngState:
    """A numpy generator as a checkpointed part (its bit generator's state)."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def state_dict(self) -> dict[str, Any]:
        return dict(self.rng.bit_generator.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state
