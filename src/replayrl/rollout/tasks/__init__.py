"""Verifiable tasks: prompts with answer columns and a correctness check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayrl.rollout.tasks.arithmetic import ArithmeticTask
from replayrl.rollout.tasks.base import Task
from replayrl.rollout.tasks.datasets import DatasetTask
from replayrl.rollout.tasks.reasoning import ReasoningTask

if TYPE_CHECKING:
    from replayrl.config.schema import TaskConfig

__all__ = [
    "ArithmeticTask",
    "DatasetTask",
    "ReasoningTask",
    "Task",
    "make_task",
    "task_from_config",
]


def make_task(name: str, **kwargs: object) -> Task:
    if name == "arithmetic":
        return ArithmeticTask(**kwargs)  # type: ignore[arg-type]
    if name == "dataset":
        return DatasetTask(kwargs.pop("path"), **kwargs)  # type: ignore[arg-type]
    if name == "reasoning":
        return ReasoningTask(**kwargs)  # type: ignore[arg-type]
    if name == "reasoning_gym":
        from replayrl.rollout.tasks.reasoning_gym import ReasoningGymTask  # lazy: optional package

        return ReasoningGymTask(kwargs.pop("datasets"), **kwargs)  # type: ignore[arg-type]
    raise ValueError(
        f"task.name: unknown task {name!r} (known: arithmetic, dataset, reasoning, reasoning_gym)"
    )


def task_from_config(t: TaskConfig) -> Task:
    """The task a config's `task` section describes."""
    if t.name == "arithmetic":
        return ArithmeticTask(digits=t.digits, eval_size=t.eval_size, seed=t.seed)
    if t.name == "reasoning_gym":
        from replayrl.rollout.tasks.reasoning_gym import ReasoningGymTask  # lazy: optional package

        rg = t.reasoning_gym
        return ReasoningGymTask(
            rg.datasets,
            size=rg.size,
            config=rg.config,
            weights=rg.weights,
            eval_size=t.eval_size,
            seed=t.seed,
            system_prompt=t.system_prompt,
        )
    if t.name == "reasoning":
        return ReasoningTask(
            op=t.op,
            digits=t.digits,
            min_digits=t.min_digits,
            terms=t.terms,
            eval_size=t.eval_size,
            seed=t.seed,
        )
    return DatasetTask(
        t.path,
        eval_path=t.eval_path,
        prompt_column=t.prompt_column,
        answer_column=t.answer_column,
        solution_column=t.solution_column,
        format=t.format,
        eval_size=t.eval_size,
        seed=t.seed,
    )
