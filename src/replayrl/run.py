"""Entry points: `train(cfg)` starts a run, `resume(run_dir)` continues one; the runtime
(sync, async-local, ray) picks the recipe. The CLI and the Python API call these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from replayrl.config import Config, load_config
from replayrl.io import quiet_transformers
from replayrl.run_folder import check_resume_config, new_run_folder, run_guard, write_config

Log = Callable[[str], None]


def train(cfg: Config, log: Log = print) -> dict[str, Any]:
    """Start a new run from a resolved config; returns its summary (also in summary.json)."""
    quiet_transformers()
    run_dir = Path(cfg.logging.run_dir) / cfg.logging.name
    # an overwritten run is moved aside, deleted only once this one has started (model,
    # data, rewards loaded) and put back if the start fails
    with new_run_folder(run_dir, cfg.logging.overwrite, log=log):
        write_config(run_dir, cfg)
        start = _runtime(cfg, run_dir, log, resume=False)
    with run_guard(run_dir, log=log):  # expected failures name the last good checkpoint
        return start()


def resume(
    run_dir: str | Path, overrides: list[str] | None = None, log: Log = print
) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (config from the run folder + overrides)."""
    quiet_transformers()
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    cfg = load_config(cfg_path, overrides)
    check_resume_config(load_config(cfg_path), cfg)  # before anything is written
    start = _runtime(cfg, run_dir, log, resume=True)  # restores the checkpoint (not ray's)
    write_config(run_dir, cfg)  # only once the checkpoint accepted the overrides
    with run_guard(run_dir, log=log):
        return start()


def _runtime(cfg: Config, run_dir: Path, log: Log, resume: bool) -> Callable[[], dict[str, Any]]:
    """Build the run's session for its runtime; returns the call that runs its loop."""
    if cfg.runtime == "ray":
        from replayrl.distributed.ray_runtime import RayDriver

        return RayDriver(cfg, run_dir, log=log, resume=resume).run
    if cfg.runtime == "async-local":
        from replayrl.distributed.local import local_pool
        from replayrl.recipes.asynchronous import AsyncSession, run_async

        s = AsyncSession(cfg, run_dir, local_pool, log=log, resume=resume)
        return lambda: run_async(s)
    from replayrl.recipes.sync import run_sync
    from replayrl.session import Session

    session = Session(cfg, run_dir, log=log, resume=resume)
    return lambda: run_sync(session)
