"""What a Python-API run records so that its config.yaml replays it from the command line.

- An in-memory dataset (a `datasets.Dataset`, a list of dicts, a DataFrame) is copied as JSONL
  into the run folder (`data/train.jsonl`, `data/eval.jsonl`), and config.yaml's
  `task.dataset.path` / `eval_path` name the copy, so `replayrl train -c RUN/config.yaml`
  reads the same rows (and `task.eval_size` / `task.seed` give the same split).
- A reward callable is recorded by its importable name `package.module:function` when that
  name gives the same function back; otherwise (a lambda, a function defined in the script
  being run or inside another function, a callable object) config.yaml says in the reward's
  name that the run cannot be replayed from the command line, and why.
- A reward callable never takes a built-in reward's name in the metrics: a function named
  `correctness` logs as `reward/user_correctness`, not as the built-in's `reward/correctness`.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

NOT_REPLAYABLE = "<not replayable from the command line"


def metric_name(fn: Callable[..., Any], index: int, builtin: set[str] | frozenset[str]) -> str:
    """A reward callable's name in metrics (`reward/<name>`), as TRL names it: its __name__
    (a lambda: reward_<index>), prefixed `user_` where that is a built-in reward's name."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = f"reward_{index}" if name == "<lambda>" else name
    return f"user_{name}" if name in builtin else name


def why_not_importable(fn: Callable[..., Any]) -> str | None:
    """None when `module:qualname` imports back to `fn`, else the plain reason it does not."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str) or not isinstance(module, str):
        return f"it is a callable object of class {type(fn).__name__}, not a function"
    if qualname == "<lambda>" or "<lambda>" in qualname:
        return "it is a lambda"
    if "<locals>" in qualname:
        return "it is defined inside another function"
    if "." in qualname:
        return f"it is the attribute {qualname}, not a module-level function"
    if module == "__main__":
        return "it is defined in the script being run (__main__), which cannot be imported"
    try:
        found = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError) as exc:
        return f"{module}:{qualname} does not import ({exc})"
    if found is not fn:
        return f"{module}:{qualname} names another object"
    return None


def reward_record(fn: Callable[..., Any], label: str) -> str:
    """config.yaml's name for a reward callable: `module:function` when importable, else a
    sentence (in place of the name) saying that the run cannot be replayed and why."""
    why = why_not_importable(fn)
    if why is None:
        return f"{fn.__module__}:{fn.__qualname__}"
    # no ':' in it: the resume checks read a ':' as a code reference
    return (
        f"{NOT_REPLAYABLE} - the reward function {label} is not importable by name because "
        f"{why.replace(':', '.')}; define it at the top level of a module so that its name "
        "is recorded here, or pass the function again to ReplayTrainer to resume>"
    )


def _plain(value: Any) -> Any:
    """JSON's form of a dataset value: numpy scalars and arrays as Python numbers and lists;
    anything else that JSON cannot hold raises TypeError (named by the caller)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    raise TypeError(f"a {type(value).__name__} value")


def _rows(source: Any) -> Iterator[Any]:
    if hasattr(source, "column_names") and hasattr(source, "to_list"):  # datasets.Dataset
        yield from source.to_list()
    elif hasattr(source, "columns") and hasattr(source, "to_dict"):  # pandas.DataFrame
        yield from source.to_dict("records")
    else:
        yield from source


def jsonl_copy(source: Any) -> tuple[str | None, str]:
    """(JSONL text of the rows, "") or (None, why they cannot be copied). NaN is written as
    null (JSON has no NaN; pandas fills missing cells with it)."""
    lines = []
    try:
        for row in _rows(source):
            if isinstance(row, dict):
                row = {
                    k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()
                }
            lines.append(json.dumps(row, default=_plain, allow_nan=False) + "\n")
    except (TypeError, ValueError) as exc:
        return None, f"its rows hold values JSON cannot store ({exc})"
    return "".join(lines), ""
