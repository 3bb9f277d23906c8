"""What every method's builder receives, and what a method may ask of the run's parts.

A method (`BatchSource`, methods/buffer.py) decides each step's training batch. Its registry
entry (`replayrl.config.registries.METHODS`) names a builder
`build(ctx: SourceContext) -> BatchSource`; the run builds one context and looks the method
up by `method.name`, so the run never dispatches on a method's name.

A method sits above the producer and the learner it drives but imports neither: it asks
them only what `ProducerPort` and `LearnerPort` declare (the run's `RolloutProducer` and
`Learner` implement them), so every call it makes is one a reader and a type checker see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from replayrl.data.buffer import Buffer
from replayrl.data.rollout_record import Rollout

if TYPE_CHECKING:
    import torch

    from replayrl.config.schema import Config

GROUP_STRIDE = 1_000_000  # group ids of a step: step * stride + call offset + prompt index

Row = dict[str, Any]  # a task row: its `prompt` and answer columns
T = TypeVar("T")


class Production(Protocol):
    """What a generation call returns (`replayrl.rollout.producer.Production`)."""

    rollouts: list[Rollout]
    seconds: float
    reward_seconds: float


class ProducerPort(Protocol):
    """What a method may ask of the run's producer (`replayrl.rollout.producer`)."""

    # the latest call's rows by the prompt text generated from, and by group id
    rows_by_text: dict[str, Any]
    last_rows: dict[int, Any]

    def produce(
        self,
        version: int,
        step: int,
        group_base: int,
        rows: list[Row] | None = None,
        num_generations: int | None = None,
        num_prompts: int | None = None,
    ) -> Any:
        """Generate (for the given task rows, or newly sampled prompts); a `Production`."""
        ...

    def sample_prompts(self, n: int) -> list[Row]:
        """`n` new task rows from the run's prompt stream."""
        ...

    def serve_prompts_through(self, wrap: Callable[[Any], T]) -> T:
        """Sample new prompts from `wrap(task)` from now on (a method's prompt pool)."""
        ...


class LearnerPort(Protocol):
    """What a method may ask of the run's learner (`replayrl.learner.learner.Learner`)."""

    version: int  # the policy version: bumped after every training step

    def reincarnate(self) -> None:
        """pi_base <- the current policy (ReMix's policy reincarnation)."""
        ...

    def current_logprobs(self, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Each rollout's completion log-probs under the current policy."""
        ...

    def behaviour_logprobs(self, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Each rollout's behaviour log-probs as the loss's importance ratio uses them (the
        learner's recomputed log pi_old where it keeps one, else the sampler's)."""
        ...

    def mean_entropies(self, rollouts: Sequence[Rollout]) -> list[float]:
        """Each rollout's mean token entropy under the current policy."""
        ...


@dataclass
class SourceContext:
    """The run's parts a method may build on.

    producer: the run's producer (None in unit tests and the `auto` design's rebuild):
        generates for newly sampled prompts or for given task rows.
    learner: the run's learner (None likewise), e.g. for entropies of stored responses.
    """

    cfg: Config
    buffer: Buffer
    producer: ProducerPort | None = None
    learner: LearnerPort | None = None

    def section(self, name: str) -> Any:
        """A method's own validated settings (`method.<name>`)."""
        return self.cfg.method.section(name)


Check = Callable[["Config"], None]
