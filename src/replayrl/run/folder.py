"""Run folders that a failed start or resume never loses.

- A new run over an existing folder (`logging.overwrite=true`) first moves the old run
  aside (a hidden sibling `.<name>.replaced-<pid>`); the old run is deleted only once the
  new one has started (model, data and rewards loaded), and is put back if the start fails.
- A resume checks its overrides against the run's saved config before anything is written,
  and the run's `config.yaml` is rewritten (atomically) only after the resumed trainer has
  restored its checkpoint, so a refused override never bricks later resumes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from replayrl.config.schema import Config, ConfigError, config_to_yaml
from replayrl.errors import RunFailed
from replayrl.storage.checkpoint import CheckpointWriteError, find_checkpoints
from replayrl.storage.io import atomic_write_text

Log = Callable[[str], None]

# config keys a checkpoint's contents depend on: the policy weights, the buffer's layout,
# the critic, ReMix's window and the learners' shards. Changing them on resume is refused.
FROZEN_ON_RESUME = (
    "model.path",
    "model.dtype",
    "model.lora",
    "model.tiny",
    "model.warmstart",
    "buffer.kind",
    "buffer.capacity",
    "buffer.sampler",
    "buffer.num_shards",
    "algorithm.advantage",
    "remix.enabled",
    "remix.num_policies",
    "runtime",
    "workers.learners",
)


def _aside_path(run_dir: Path) -> Path:
    return run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")


def leftover_asides(run_dir: Path) -> list[Path]:
    """Old runs moved aside by starts that were killed before they could restore them."""
    return sorted(run_dir.parent.glob(f".{run_dir.name}.replaced-*"))


@contextmanager
def new_run_folder(run_dir: Path, overwrite: bool, log: Log = print) -> Iterator[Path]:
    """Give the body an empty `run_dir`; on success drop the run it replaces, on failure
    (any exception, Ctrl-C included) delete what the body wrote and put the old run back."""
    for old in leftover_asides(run_dir):
        log(
            f"warning: {old} holds a run moved aside by a start that was killed; "
            f"rename it back to {run_dir} to keep it, or delete it"
        )
    aside = None
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"run folder {run_dir} already exists: resume it with `--resume {run_dir}`, "
                f"pick another logging.name, or set logging.overwrite=true"
            )
        aside = _aside_path(run_dir)
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(run_dir, aside)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        yield run_dir
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # a failed start must not block a rerun
        if aside is not None:
            os.replace(aside, run_dir)
            log(f"the start failed: the earlier run in {run_dir} is kept as it was")
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_resume_config(saved: Config, new: Config) -> None:
    """ConfigError naming each key whose override a checkpoint cannot honour."""
    a, b = saved.model_dump(mode="json"), new.model_dump(mode="json")
    bad = [
        f"{k} (the run has {_get(a, k)!r}, the override asks {_get(b, k)!r})"
        for k in FROZEN_ON_RESUME
        if _get(a, k) != _get(b, k)
    ]
    if bad:
        raise ConfigError(
            "resume: these settings are fixed by the run's checkpoints and cannot change: "
            + "; ".join(bad)
            + " (nothing was written; start a new run to change them)"
        )


def write_config(run_dir: Path, cfg: Config) -> None:
    atomic_write_text(run_dir / "config.yaml", config_to_yaml(cfg))


def last_good_checkpoint(run_dir: Path | None) -> str:
    """A sentence naming the newest complete checkpoint under `run_dir` (for error text)."""
    if run_dir is None or not run_dir.is_dir():
        return "no checkpoint was written"
    path, _ = find_checkpoints(run_dir)
    if path is None:
        return f"no complete checkpoint under {run_dir}"
    return f"last good checkpoint: {path} (continue with `replayrl train --resume {run_dir}`)"


@contextmanager
def run_guard(run_dir: Path, log: Log = print) -> Iterator[None]:
    """Around a started run (after `new_run_folder` / a resumed trainer's restore): an
    expected failure (a write error such as a full disk or a
    file-size limit, a RunFailed such as exhausted worker restarts) becomes a RunFailed
    whose message names the last good checkpoint; Ctrl-C logs it too."""
    try:
        yield
    except KeyboardInterrupt:
        log(last_good_checkpoint(run_dir))
        raise
    except (OSError, RunFailed) as exc:
        if isinstance(exc, CheckpointWriteError):  # its message names the last good one
            raise RunFailed(str(exc)) from exc
        what = "" if isinstance(exc, RunFailed) else f"{type(exc).__name__}: "
        raise RunFailed(f"{what}{exc}; {last_good_checkpoint(run_dir)}") from exc
