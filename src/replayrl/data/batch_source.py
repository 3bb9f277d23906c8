"""Where each step's training batch comes from: a buffer, or ReMix's fresh + window mix.

The loop pushes a step's fresh rollouts and asks for (batch, passes); whether the batch is
B samples of a replay buffer, the freshest R of an on-policy queue, or Mix-PPG's fresh
rollouts plus a share p from the last N_pol policies is this component's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from replayrl.config.schema import RemixConfig
from replayrl.data.buffer import Buffer
from replayrl.data.rollout import Rollout

Log = Callable[[str], None]


class Counters(Protocol):
    """What a batch source reads and records in the run's counters (`replayrl.run.state`)."""

    step: int
    reincarnation_step: int | None

    def retire(self, buffer: Any) -> None: ...


class BatchSource(Protocol):
    buffer: Buffer  # the run's main buffer (its size is logged each step)

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None: ...
    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]: ...
    def buffers(self) -> list[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BufferSource:
    """Paper 1: push the fresh rollouts, sample B (on-policy: the freshest; replay: uniform
    or positive-bias over the FIFO), `epochs` passes over it."""

    def __init__(self, buffer: Buffer, batch_size: int, epochs: int) -> None:
        self.buffer, self.batch_size, self.epochs = buffer, batch_size, epochs

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None:
        pass

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        self.buffer.push(fresh)
        return self.buffer.sample(self.batch_size, current_version=version), self.epochs

    def buffers(self) -> list[Any]:
        return [self.buffer]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


class RemixSource(BufferSource):
    """ReMix (arXiv 2507.06892): before step T, Mix-PPG batches = the fresh rollouts
    plus a share p sampled (without removal) from the window of the last N_pol policies'
    rollouts, m = utd passes; at step T policy reincarnation (pi_base <- pi_T, the window is
    dropped), then plain on-policy batches with utd_after passes."""

    def __init__(self, buffer: Buffer, window: Buffer | None, batch_size: int, rm: RemixConfig):
        super().__init__(buffer, batch_size, rm.utd_after)
        self.window, self.rm = window, rm
        self.step = 0  # the step about to run (set by before_step)

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None:
        self.step = step = counters.step
        if step == self.rm.reincarnation_step and counters.reincarnation_step is None:
            learner.reincarnate()
            if self.window is not None:
                counters.retire(self.window)
            self.window = None  # from now on plain on-policy training
            counters.reincarnation_step = step
            log(f"policy reincarnation at step {step}: pi_base <- pi_{step}, p = 0")

    @property
    def mixing(self) -> bool:
        T = self.rm.reincarnation_step
        return self.window is not None and (T is None or self.step < T)

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        if not self.mixing:
            return super().next_batch(fresh, version)
        assert self.window is not None
        p = self.rm.off_policy_fraction
        n_stale = round(p / (1 - p) * len(fresh))  # p of the batch is replayed, 1 - p fresh
        stale = self.window.sample(n_stale, current_version=version) if n_stale else []
        self.window.push(fresh)
        return fresh + stale, self.rm.utd

    def buffers(self) -> list[Any]:
        return [b for b in (self.buffer, self.window) if b is not None]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "window": self.window.state_dict() if self.window is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("window") is None:
            self.window = None  # after reincarnation
        elif self.window is not None:
            self.window.load_state_dict(state["window"])
