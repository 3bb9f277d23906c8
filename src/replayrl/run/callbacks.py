"""Callbacks and injected objects: how a Python caller reaches inside the training loop.

`ReplayCallback` is what users subclass (or pass plain functions for `on_step_end`; the API
wraps transformers `TrainerCallback`s into one, api/trl_compat.py). `RunHooks`
is what the loop receives: objects to use instead of building them from the config (a task over
in-memory rows, reward callables, a model object) and the callbacks to call. The loop only calls
`RunHooks` methods; a callback returning True (or calling `RunHooks.request_stop`) makes the loop
stop cleanly after the current step, like TRL's `control.should_training_stop`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

StepFn = Callable[[int, dict[str, Any]], "bool | None"]


class ReplayCallback:
    """Base class for training callbacks; override the methods you need.

    Each `on_*` method may return True to stop training after the current step: the loop then
    evaluates (unless the step already had an evaluation), writes a final checkpoint and its
    summary, exactly as at the end of a run, and `train(resume_from_checkpoint=True)` continues
    from there later.

    - `on_train_begin(config)`: before the model is loaded (`config`: the resolved `Config`;
      its return value is not used).
    - `on_step_end(step, metrics)`: after each training step; `metrics` is that step's record in
      metrics.jsonl (`reward/mean`, `train/loss`, `train/entropy`, `eval/accuracy` when the step
      evaluated, ...). `step` counts from 1.
    - `on_evaluate(step, metrics)`: after each evaluation (`eval/accuracy`, ...); step 0 is the
      evaluation of the starting policy.
    - `on_checkpoint(step, path)`: after a checkpoint folder is written.
    - `on_train_end(summary)`: after training with the run's summary (as in summary.json).
    """

    def on_train_begin(self, config: Any) -> None:
        return None

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return None

    def on_evaluate(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return None

    def on_checkpoint(self, step: int, path: Path) -> bool | None:
        return None

    def on_train_end(self, summary: dict[str, Any]) -> None:
        return None


class _StepFunction(ReplayCallback):
    """A plain function `fn(step, metrics)` used as `on_step_end`."""

    def __init__(self, fn: StepFn) -> None:
        self.fn = fn

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return self.fn(step, metrics)

    def __repr__(self) -> str:
        return f"on_step_end({getattr(self.fn, '__name__', self.fn)!r})"


def as_callbacks(callbacks: Sequence[ReplayCallback | StepFn] | None) -> list[ReplayCallback]:
    """`ReplayCallback` objects as they are; a plain callable becomes an `on_step_end`."""
    out: list[ReplayCallback] = []
    for cb in callbacks or []:
        if isinstance(cb, type):
            raise TypeError(f"callbacks: pass an instance, not the class {cb.__name__}")
        if isinstance(cb, ReplayCallback):
            out.append(cb)
        elif callable(cb):
            out.append(_StepFunction(cb))
        else:
            raise TypeError(
                f"callbacks: {cb!r} is neither a ReplayCallback, a transformers TrainerCallback "
                "nor a callable(step, metrics)"
            )
    return out


@dataclass
class RunHooks:
    """What the training loop takes from a Python caller instead of building it itself.

    task: a Task (e.g. a DatasetTask over in-memory rows) used instead of `cfg.task`.
    rewards: WeightedReward list (callables) used instead of resolving `cfg.rewards` names.
    policy: (model, tokenizer, model_path) used instead of `load_policy` for a new run (a
        resumed run always loads its checkpoint's policy).
    callbacks: called at the end of each step, after each evaluation and checkpoint.
    run_files: written into a new run's folder when it starts.
    """

    task: Any = None
    rewards: list[Any] | None = None
    policy: tuple[Any, Any, str] | None = None
    callbacks: list[ReplayCallback] = field(default_factory=list)
    stop_requested: bool = False
    # files written into a new run's folder as it starts (path inside it -> text): the JSONL
    # copy of an in-memory dataset that config.yaml's task.dataset.path names
    run_files: dict[str, str] = field(default_factory=dict)

    def request_stop(self) -> None:
        """Stop after the current step (checked by the loop between steps)."""
        self.stop_requested = True

    def _call(self, method: str, *args: Any) -> None:
        for cb in self.callbacks:
            if getattr(cb, method)(*args):
                self.stop_requested = True

    # the loop calls these three ---------------------------------------------------------
    def step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self._call("on_step_end", step, dict(metrics))

    def evaluated(self, step: int, metrics: dict[str, Any]) -> None:
        self._call("on_evaluate", step, dict(metrics))

    def checkpointed(self, step: int, path: Path) -> None:
        self._call("on_checkpoint", step, path)

    # the API calls these two ------------------------------------------------------------
    def train_begin(self, config: Any) -> None:
        for cb in self.callbacks:
            cb.on_train_begin(config)

    def train_end(self, summary: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_train_end(summary)
