"""Verifiable tasks: prompts with answer columns and a correctness check."""

from replayrl.tasks.arithmetic import ArithmeticTask
from replayrl.tasks.base import Task

__all__ = ["ArithmeticTask", "Task", "make_task"]


def make_task(name: str, **kwargs: object) -> Task:
    if name == "arithmetic":
        return ArithmeticTask(**kwargs)  # type: ignore[arg-type]
    raise ValueError(f"task.name: unknown task {name!r} (known: arithmetic)")
