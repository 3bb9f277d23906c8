"""Verifiable tasks: prompts with answer columns and a correctness check.

Each task is registered below (`replayrl.config.registries.TASKS`): a builder from the
config's `task` section, a constructor for `make_task`, and its own config rules. The schema
checks `task.name` against the registry; the run looks the builder up by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayrl.config.registries import TASKS, TaskSpec
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


def make_task(name: str, **kwargs: Any) -> Task:
    """The task `name` built from keyword arguments (its class's own)."""
    return TASKS.get(name).make(**kwargs)  # type: ignore[no-any-return]


def task_from_config(t: TaskConfig) -> Task:
    """The task a config's `task` section describes."""
    return TASKS.get(t.name).build(t)  # type: ignore[no-any-return]


# -- the built-in tasks -----------------------------------------------------------------------


def _reasoning_gym(datasets: Any, **kwargs: Any) -> Task:
    from replayrl.rollout.tasks.reasoning_gym import ReasoningGymTask  # lazy: optional package

    return ReasoningGymTask(datasets, **kwargs)  # type: ignore[return-value]


def _reasoning_gym_from_config(t: TaskConfig) -> Task:
    rg = t.reasoning_gym
    return _reasoning_gym(
        rg.datasets,
        size=rg.size,
        config=rg.config,
        weights=rg.weights,
        eval_size=t.eval_size,
        seed=t.seed,
        system_prompt=t.system_prompt,
    )


def _check_reasoning_gym(t: TaskConfig) -> None:
    if not t.reasoning_gym.datasets:
        raise ValueError("task.reasoning_gym.datasets must name at least one dataset")


def _dataset_from_config(t: TaskConfig) -> Task:
    return DatasetTask(
        t.path,  # type: ignore[arg-type]  # checked: _check_dataset
        eval_path=t.eval_path,
        prompt_column=t.prompt_column,
        answer_column=t.answer_column,
        solution_column=t.solution_column,
        format=t.format,
        eval_size=t.eval_size,
        seed=t.seed,
    )


def _check_dataset(t: TaskConfig) -> None:
    if not t.path:
        raise ValueError("task.path must name a local data file for task.name=dataset")


def _reasoning_from_config(t: TaskConfig) -> Task:
    return ReasoningTask(
        op=t.op,
        digits=t.digits,
        min_digits=t.min_digits,
        terms=t.terms,
        eval_size=t.eval_size,
        seed=t.seed,
    )


TASKS.add(
    "arithmetic",
    TaskSpec(
        lambda t: ArithmeticTask(digits=t.digits, eval_size=t.eval_size, seed=t.seed),
        ArithmeticTask,
        summary="built-in addition of task.digits-digit numbers, answer only",
    ),
)
TASKS.add(
    "dataset",
    TaskSpec(
        _dataset_from_config,
        lambda path, **kw: DatasetTask(path, **kw),
        _check_dataset,
        "a local JSONL / parquet / CSV file with a prompt column and answer columns",
    ),
)
TASKS.add(
    "reasoning",
    TaskSpec(
        _reasoning_from_config,
        ReasoningTask,
        summary="written-out multi-digit add / sub / chain with carries shown step by step",
    ),
)
TASKS.add(
    "reasoning_gym",
    TaskSpec(
        _reasoning_gym_from_config,
        _reasoning_gym,
        _check_reasoning_gym,
        "procedurally generated problems from the reasoning-gym package",
    ),
)
