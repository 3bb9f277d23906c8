"""What every batch source's builder receives, and the rules the group-level sources share.

A batch source (`BatchSource`, data/sources/buffer.py) decides each step's training batch.
Its registry entry (`replayrl.config.registries.BATCH_SOURCES`) names a builder
`build(ctx: SourceContext) -> BatchSource`; the run builds one context and looks the source
up by `groups.source`, so the run never dispatches on a method's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayrl.config.registries import RUNTIMES
from replayrl.data.buffer import Buffer

if TYPE_CHECKING:
    from replayrl.config.schema import Config

GROUP_STRIDE = 1_000_000  # group ids of a step: step * stride + call offset + prompt index


@dataclass
class SourceContext:
    """The run's parts a source may build on.

    producer: the run's `RolloutProducer` (None in unit tests and the `auto` design's rebuild):
        `produce(version, step, group_base, rows=None, num_generations=None)` generates for
        newly sampled prompts or for the given task rows; `last_rows` maps the latest call's
        group ids to their rows; `rows_by_text` its rows by the prompt text generated from.
    learner: the run's `Learner` (None likewise), e.g. for entropies of stored responses.
    """

    cfg: Config
    buffer: Buffer
    producer: Any = None
    learner: Any = None

    def section(self, name: str) -> Any:
        """This source's own validated settings (`groups.<name>`)."""
        return self.cfg.groups.section(name)


def require_fresh_groups(cfg: Config, name: str) -> None:
    """Group-level sources decide a step's batch themselves, from fresh on-policy groups of
    the synchronous loop with GRPO's group advantages."""
    if not RUNTIMES.get(cfg.runtime).lockstep:
        raise ValueError(f"groups.source={name} needs runtime=sync (got {cfg.runtime})")
    if cfg.buffer.kind != "onpolicy" or cfg.remix.enabled:
        raise ValueError(f"groups.source={name} needs buffer.kind=onpolicy and no remix")
    if cfg.algorithm.advantage != "grpo":
        raise ValueError(f"groups.source={name} needs algorithm.advantage=grpo")


Check = Callable[["Config"], None]
