"""Where each step's training batch comes from: the protocol every method implements, and
the on-policy and replay methods, whose batch is the buffer's.

The loop pushes fresh rollouts and asks for (batch, passes); whether the batch is B samples
of a replay buffer, the freshest R of an on-policy queue, or Mix-PPG's fresh rollouts plus a
share p from the last N_pol policies (methods/remix.py) is the method's business. The
synchronous loop calls `next_batch` (push this step's rollouts, then sample); the
asynchronous one `push`es each delivery as it arrives and `sample`s when `available()` says a
batch is there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from replayrl.data.buffer import Buffer
from replayrl.data.rollout_record import Rollout

if TYPE_CHECKING:
    from replayrl.methods.base import LearnerPort, SourceContext

Log = Callable[[str], None]


class Counters(Protocol):
    """What a batch source reads and records in the run's counters (`replayrl.run.state`)."""

    step: int
    reincarnation_step: int | None
    rollouts_generated: int

    def retire(self, buffer: Any) -> int: ...
    def add(self, name: str, n: int) -> None: ...


class BatchSource(Protocol):
    """A method as the loops drive it."""

    buffer: Buffer  # the run's main buffer (its size is logged each step)

    def before_step(self, learner: LearnerPort, counters: Counters, log: Log) -> None: ...
    def prompts_this_step(self) -> int | None:
        """New prompts to generate for at the step about to run (None: rollout.prompts_per_step)."""
        ...

    def push(self, fresh: list[Rollout]) -> None: ...
    def available(self) -> int: ...
    def sample(self, version: int, n: int | None = None) -> tuple[list[Rollout], int]: ...
    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]: ...
    def buffers(self) -> list[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BufferSource:
    """Paper 1: push the fresh rollouts, sample B (on-policy: the freshest; replay: uniform
    or positive-bias over the FIFO), `epochs` passes over it."""

    def __init__(self, buffer: Buffer, batch_size: int, epochs: int) -> None:
        self.buffer, self.batch_size, self.epochs = buffer, batch_size, epochs

    def before_step(self, learner: LearnerPort, counters: Counters, log: Log) -> None:
        pass

    def prompts_this_step(self) -> int | None:
        return None

    def push(self, fresh: list[Rollout]) -> None:
        self.buffer.push(fresh)

    def available(self) -> int:
        """Rollouts a batch can draw from now (the caller drops stale ones first)."""
        return len(self.buffer)

    def sample(self, version: int, n: int | None = None) -> tuple[list[Rollout], int]:
        """(batch, passes): `n` rollouts (default B) sampled at policy `version`."""
        size = self.batch_size if n is None else n
        return self.buffer.sample(size, current_version=version), self.epochs

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        self.push(fresh)
        return self.sample(version)

    def buffers(self) -> list[Any]:
        return [self.buffer]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


# -- registry entries (methods/__init__.py) ------------------------------------------------


def build_buffer_source(ctx: SourceContext) -> BufferSource:
    """`method.name=onpolicy` or `replay`: the buffer's batches (paper 1), `train.epochs`
    passes over each."""
    return BufferSource(ctx.buffer, ctx.cfg.batch_size, ctx.cfg.train.epochs)
