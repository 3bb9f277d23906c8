"""Verifiable tasks: prompts with answer columns and a correctness check.

Each task is registered below (`replayrl.config.registries.TASKS`): a builder from the
config's `task` section, a constructor for `make_task`, its own settings (a section declared
next to its class, under `task.<name>`) and its own config rules. The schema
checks `task.name` against the registry; the run looks the builder up by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayrl.config.registries import TASKS, TaskSpec
from replayrl.rollout.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from replayrl.rollout.tasks.base import Task
from replayrl.rollout.tasks.datasets import DatasetConfig, DatasetTask
from replayrl.rollout.tasks.reasoning import ReasoningConfig, ReasoningTask
from replayrl.rollout.tasks.reasoning_gym import ReasoningGymConfig

if TYPE_CHECKING:
    from replayrl.config.schema import TaskConfig

__all__ = [
    "ArithmeticConfig",
    "ArithmeticTask",
    "DatasetConfig",
    "DatasetTask",
    "ReasoningConfig",
    "ReasoningGymConfig",
    "ReasoningTask",
    "Task",
    "describe_task",
    "make_task",
    "task_from_config",
]


def make_task(name: str, **kwargs: Any) -> Task:
    """The task `name` built from keyword arguments (its class's own)."""
    return TASKS.get(name).make(**kwargs)  # type: ignore[no-any-return]


def task_from_config(t: TaskConfig) -> Task:
    """The task a config's `task` section describes."""
    return TASKS.get(t.name).build(t)  # type: ignore[no-any-return]


def describe_task(t: TaskConfig) -> str:
    """The task's settings in a few words (its registry entry's `describe`, else its name)."""
    describe = TASKS.get(t.name).describe
    return describe(t) if describe is not None else t.name


# -- the built-in tasks: `t.settings` is the task's own section (`task.<name>`), whose
# settings are its class's keyword arguments ---------------------------------------------


def _reasoning_gym(datasets: Any, **kwargs: Any) -> Task:
    from replayrl.rollout.tasks.reasoning_gym import ReasoningGymTask  # lazy: optional package

    return ReasoningGymTask(datasets, **kwargs)  # type: ignore[return-value]


def _reasoning_gym_from_config(t: TaskConfig) -> Task:
    return _reasoning_gym(
        **t.settings.model_dump(), eval_size=t.eval_size, seed=t.seed, system_prompt=t.system_prompt
    )


def _check_reasoning_gym(t: TaskConfig) -> None:
    if not t.settings.datasets:
        raise ValueError("task.reasoning_gym.datasets must name at least one dataset")


def _dataset_from_config(t: TaskConfig) -> Task:
    own = t.settings.model_dump()
    return DatasetTask(own.pop("path"), **own, eval_size=t.eval_size, seed=t.seed)


def _check_dataset(t: TaskConfig) -> None:
    if not t.settings.path:
        raise ValueError("task.dataset.path must name a local data file for task.name=dataset")


def _reasoning_from_config(t: TaskConfig) -> Task:
    return ReasoningTask(**t.settings.model_dump(), eval_size=t.eval_size, seed=t.seed)


# arithmetic digits the built-in tiny model's warm start gives a usable start policy for
# (measured: 3 digits start at 0.0 eval accuracy with the default warm start, and nothing learns)
TINY_ARITHMETIC_DIGITS = (1, 2)


def _tiny_arithmetic(t: TaskConfig) -> None:
    digits = t.settings.digits
    if digits not in TINY_ARITHMETIC_DIGITS:
        raise ValueError(
            f"task.arithmetic.digits={digits}: the built-in tiny model's warm start gives a "
            f"usable start policy for arithmetic with task.arithmetic.digits in "
            f"{list(TINY_ARITHMETIC_DIGITS)} only (at 3 digits it starts at 0.0 accuracy and no "
            f"reward ever varies). For longer sums use the written-out task (task.name=reasoning "
            f"task.reasoning.op=add task.reasoning.digits={digits}; see "
            f"configs/reasoning-add.yaml), or set model.path to a causal LM folder"
        )


TASKS.add(
    "arithmetic",
    TaskSpec(
        lambda t: ArithmeticTask(digits=t.settings.digits, eval_size=t.eval_size, seed=t.seed),
        ArithmeticTask,
        summary="built-in addition of task.arithmetic.digits-digit numbers, answer only",
        config=ArithmeticConfig,
        # the original set: existing configs keep their cached warm starts
        warmstart_fields=frozenset({"name", "digits", "eval_size", "seed"}),
        tiny_check=_tiny_arithmetic,
        describe=lambda t: f"{t.settings.digits}-digit addition",
    ),
)
TASKS.add(
    "dataset",
    TaskSpec(
        _dataset_from_config,
        lambda path, **kw: DatasetTask(path, **kw),
        _check_dataset,
        "a local JSONL / parquet / CSV file with a prompt column and answer columns",
        config=DatasetConfig,
        describe=lambda t: Path(str(t.settings.path)).name,
        data_file=lambda t: t.settings.path,
    ),
)
TASKS.add(
    "reasoning",
    TaskSpec(
        _reasoning_from_config,
        ReasoningTask,
        summary="written-out multi-digit add / sub / chain with carries shown step by step",
        config=ReasoningConfig,
        warmstart_fields=frozenset(
            {"name", "op", "digits", "min_digits", "terms", "eval_size", "seed"}
        ),
        describe=lambda t: f"{t.settings.op}, {t.settings.digits} digits, {t.settings.terms} terms",
    ),
)
TASKS.add(
    "reasoning_gym",
    TaskSpec(
        _reasoning_gym_from_config,
        _reasoning_gym,
        _check_reasoning_gym,
        "procedurally generated problems from the reasoning-gym package",
        config=ReasoningGymConfig,
        describe=lambda t: ", ".join(t.settings.datasets),
    ),
)
