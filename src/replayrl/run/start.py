"""Entry points: `train(cfg)` starts a run, `resume(run_dir)` continues one; the runtime
(a `RUNTIMES` registry entry: sync, async-local, ray) picks the recipe. The CLI and the
Python API call these."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from replayrl.config.registries import RUNTIMES, runtimes_with
from replayrl.config.schema import Config, ConfigError, load_config
from replayrl.run.callbacks import RunHooks
from replayrl.run.records.folder import (
    check_layout,
    check_resume_code,
    check_resume_config,
    new_run_folder,
    record_origin,
    run_guard,
    run_lock,
    sign_run,
    write_config,
)
from replayrl.run.session import InterruptOnSignal
from replayrl.storage.checkpoint import clean_leftovers
from replayrl.storage.io import atomic_write_text, quiet_transformers

Log = Callable[[str], None]

# consent to run the reward code a resumed run folder names: the CLI always decides
# (`--trust-run-code`, a context variable so that it reaches `resume` through the Python
# API); None, a Python caller that did not decide, is consent with a warning in the log
TRUST_RUN_CODE: ContextVar[bool | None] = ContextVar("replayrl_trust_run_code", default=None)


@contextmanager
def trusting_run_code(trust: bool | None = True) -> Iterator[None]:
    token = TRUST_RUN_CODE.set(trust)
    try:
        yield
    finally:
        TRUST_RUN_CODE.reset(token)


def train(cfg: Config, log: Log = print, hooks: RunHooks | None = None) -> dict[str, Any]:
    """Start a new run from a resolved config; returns its summary (also in summary.json).

    `hooks`: objects (policy, task, rewards) and callbacks from the Python API."""
    check_hooks(cfg, hooks)
    quiet_transformers()
    run_dir = Path(cfg.logging.run_dir) / cfg.logging.name
    # SIGTERM / SIGHUP unwind like Ctrl-C (the loop itself stops after a step); one process
    # per run folder, locked before anything is written
    with InterruptOnSignal(), run_lock(run_dir):
        # an overwritten run is moved aside, deleted only once this one has started (model,
        # data, rewards loaded) and put back if the start fails
        with new_run_folder(run_dir, cfg.logging.overwrite, log=log):
            write_config(run_dir, cfg)
            for name, text in (hooks.run_files if hooks is not None else {}).items():
                (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(run_dir / name, text)  # e.g. an in-memory dataset's copy
            record_origin(run_dir, cfg)  # where it started, the reward files' SHA-256
            sign_run(run_dir, cfg, log)  # so that its own resume runs its reward code unasked
            start = _runtime(cfg, run_dir, log, resume=False, hooks=hooks)
        with run_guard(run_dir, log=log):  # expected failures name the last good checkpoint
            return start()


def resume(
    run_dir: str | Path,
    overrides: list[str] | None = None,
    log: Log = print,
    hooks: RunHooks | None = None,
) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (config from the run folder + overrides)."""
    quiet_transformers()
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    with InterruptOnSignal(), run_lock(run_dir):  # one process per run folder
        cfg = load_config(cfg_path, overrides)
        # the folder as it is now (it may have been moved since it was written)
        cfg.logging.run_dir, cfg.logging.name = str(run_dir.parent), run_dir.name
        check_hooks(cfg, hooks)
        # before anything is written: fixed keys against the checkpoint's record, then the
        # code and paths the run folder names
        check_resume_config(load_config(cfg_path), cfg, run_dir, log)
        own = hooks is not None and hooks.rewards is not None
        trust = TRUST_RUN_CODE.get()
        # the code it names runs when the folder's signed record verifies with this user's
        # key, with consent (--trust-run-code), or not at all (rewards given again)
        check_resume_code(run_dir, cfg, list(overrides or []), trust, own, log)
        check_layout(run_dir)
        for left in clean_leftovers(run_dir):
            log(f"removed {left}: the temp folder of a checkpoint write that was killed")
        # restores the checkpoint (not ray's)
        start = _runtime(cfg, run_dir, log, resume=True, hooks=hooks)
        write_config(run_dir, cfg)  # only once the checkpoint accepted the overrides
        # what runs now ran with consent (signature, flag or rewards given): sign it as this
        # user's, so that the next resume (a requeue) needs no flag
        sign_run(run_dir, cfg, log)
        with run_guard(run_dir, log=log):
            return start()


def check_hooks(cfg: Config, hooks: RunHooks | None) -> None:
    """Hooks reach the synchronous loop only (async and Ray workers build their own objects)."""
    if hooks is not None and not RUNTIMES.get(cfg.runtime).hooks:
        raise ConfigError(
            f"model objects, in-memory datasets, reward callables and callbacks need "
            f"{runtimes_with('hooks')} (got runtime={cfg.runtime}): give files and names instead"
        )


def _runtime(
    cfg: Config, run_dir: Path, log: Log, resume: bool, hooks: RunHooks | None = None
) -> Callable[[], dict[str, Any]]:
    """Build the run's session for its runtime; returns the call that runs its loop."""
    return RUNTIMES.get(cfg.runtime).start(cfg, run_dir, log, resume, hooks)
