"""The built-in runtimes, registered by name (`runtime`): each starts its own session.

The starters import their loops lazily: reading a config loads no runtime (and no Ray).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayrl.config.registries import RUNTIMES, RuntimeSpec
from replayrl.run.distributed.ray_settings import SECTION, RayConfig

if TYPE_CHECKING:
    from replayrl.config.schema import Config
    from replayrl.run.callbacks import RunHooks

Log = Callable[[str], None]
Loop = Callable[[], dict[str, Any]]


def start_sync(
    cfg: Config, run_dir: Path, log: Log, resume: bool, hooks: RunHooks | None = None
) -> Loop:
    """One process: generate, then train, each step."""
    from replayrl.run.loops.sync import run_sync
    from replayrl.run.session import Session

    session = Session(cfg, run_dir, log=log, resume=resume, hooks=hooks)
    return lambda: run_sync(session)


def start_async_local(
    cfg: Config, run_dir: Path, log: Log, resume: bool, hooks: RunHooks | None = None
) -> Loop:
    """Generator processes on this machine, training concurrently with the learner."""
    from replayrl.run.distributed.local import local_pool
    from replayrl.run.loops.asynchronous import AsyncSession, run_async

    s = AsyncSession(cfg, run_dir, local_pool, log=log, resume=resume)
    return lambda: run_async(s)


def start_ray(
    cfg: Config, run_dir: Path, log: Log, resume: bool, hooks: RunHooks | None = None
) -> Loop:
    """Generators, the buffer and learners as Ray actors."""
    from replayrl.run.distributed.ray_runtime import RayDriver

    return RayDriver(cfg, run_dir, log=log, resume=resume).run


RUNTIMES.add(
    "sync",
    RuntimeSpec(start_sync, lockstep=True, hooks=True, summary="one process, generate then train"),
)
RUNTIMES.add(
    "async-local",
    RuntimeSpec(
        start_async_local,
        summary="generator processes on this machine train concurrently with the learner",
    ),
)
RUNTIMES.add(
    "ray",
    RuntimeSpec(
        start_ray,
        multi_learner=True,
        section=(SECTION, RayConfig),
        summary="generators, buffer, learners as Ray actors",
    ),
)
