"""Errors every layer may raise; the CLI turns them into one-line messages."""

from __future__ import annotations


class RunFailed(RuntimeError):
    """An expected failure of a running run (the message names the last good checkpoint)."""


class RewardFunctionFailed(RunFailed):
    """A reward function failed on every call for `train.failure_patience` steps in a row:
    every rollout was dropped, so nothing could be trained (the message names it)."""

    def __init__(self, name: str, first_error: str, steps: int) -> None:
        super().__init__(
            f"reward function {name!r} failed on every call for {steps} steps in a row, so "
            f"every rollout was dropped and nothing was trained; first error: {first_error}"
        )
        self.name, self.first_error, self.steps = name, first_error, steps


class RunStopped(KeyboardInterrupt):
    """A run stopped by a signal (SIGINT, SIGTERM, SIGHUP); the CLI exits 128 + `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RunDoesNotFit(ValueError):
    """The planned learner memory exceeds the learner GPU's free memory (`train.preflight`):
    the message names the estimate, the memory available and the knobs that would fit."""


class GenerationServerError(RunFailed):
    """A generation server (rollout.backend=vllm_server) could not be reached, answered with
    an error, served another model, or did not answer in time (the message says which, and
    what to check)."""
