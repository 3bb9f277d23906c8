"""Where the entry points used to live: `train` and `resume` are in `replayrl.run`, the
loops in `replayrl.recipes`, the session (formerly `Trainer`) in `replayrl.session`."""

from replayrl.run import prepare_run_dir, resume, train
from replayrl.session import Session as Trainer

__all__ = ["Trainer", "prepare_run_dir", "resume", "train"]
