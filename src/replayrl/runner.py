"""Where the entry points used to live: `train` and `resume` are in `replayrl.run`, the
loops in `replayrl.recipes`, the session (formerly `Trainer`) in `replayrl.session`, run
folder handling in `replayrl.run_folder`."""

from replayrl.run import resume, train
from replayrl.session import Session as Trainer

__all__ = ["Trainer", "resume", "train"]
