"""Where a task's settings go: `task.<name>`, the section its registry entry declares.

The `task` section holds what every task has (name, seed, eval_size, ...) and the selected
task's own section (`task.reasoning.op`, `task.dataset.path`), validated by the model the
task declares next to its code (`replayrl.rollout.tasks`, or a plugin's module), so a new
task brings its settings without editing this file.

Before these sections, a task's settings sat flat on `task` (`task.op=add`). Such a key is
still read for one release: moved into the selected task's section with a warning that
names the new key. A setting of a task other than the selected one is an error naming its
section, except at its default in a config written before the sections (such a
config.yaml lists every task's defaults, which say nothing).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel, ValidationError

from replayrl.config.registries import TASKS
from replayrl.config.section import nested_errors


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _owners(key: str) -> list[str]:
    """The registered tasks whose section has a setting named `key`."""
    return [
        name
        for name, spec in TASKS.items()
        if spec.config is not None and key in spec.config.model_fields
    ]


def _at_default(key: str, value: Any, owners: list[str]) -> bool:
    for owner in owners:
        section = TASKS.get(owner).config
        assert section is not None  # an owner declares one
        if section.model_fields[key].get_default(call_default_factory=True) != value:
            return False
    return True


def _other_section(name: str, other: str, given: Any, old_record: bool) -> None:
    """A section of a task that is not the selected one: an error unless it is empty (or,
    in a record written before the sections, at its defaults)."""
    given = _plain(given)
    if given is None or given == {}:
        return  # `task.reasoning=null` drops a preset's section when the task changes
    section = TASKS.get(other).config
    if old_record and section is not None and isinstance(given, dict):
        if all(_at_default(k, v, [other]) for k, v in given.items() if k in section.model_fields):
            return
    keys = sorted(given) if isinstance(given, dict) else []
    first = f"task.{other}.{keys[0]}" if keys else f"task.{other}"
    raise ValueError(
        f"{first}: a setting of task.name={other}, but the selected task is {name}: set "
        f"task.name={other}, or drop the section (task.{other}=null)"
    )


def _flat_key(
    name: str, key: str, value: Any, own: dict[str, Any], common: Collection[str]
) -> None:
    """An old flat key (`task.op`): into the selected task's section, with a warning."""
    owners = _owners(key)
    if not owners:
        spec = TASKS.get(name)
        mine = sorted(spec.config.model_fields) if spec.config is not None else []
        raise ValueError(
            f"task.{key}: no such setting (every task has: {', '.join(sorted(common))}; "
            f"task.name={name} has: "
            + (", ".join(f"task.{name}.{k}" for k in mine) or "no settings of its own")
            + ")"
        )
    if name not in owners:
        if _at_default(key, value, owners):
            return  # an old record's default for a task it does not run: says nothing
        sections = " or ".join(f"task.{o}.{key} (task.name={o})" for o in owners)
        raise ValueError(
            f"task.{key}={value!r} is a setting of {sections}, but the selected task is {name}"
        )
    if key in own:
        raise ValueError(
            f"task.{key} is the old name of task.{name}.{key}: give only task.{name}.{key}"
        )
    warnings.warn(
        f"task.{key} is now task.{name}.{key} (each task's settings are in its own "
        "section); the old key is read this time",
        FutureWarning,
        stacklevel=2,
    )
    own[key] = value


def place_task_keys(data: Any, common: Collection[str], default_name: str) -> dict[str, Any]:
    """`task`'s raw data with the selected task's section validated under its name (its
    defaults where not given) and no other task's section; ValueError naming the key for a
    setting that belongs elsewhere or nowhere."""
    data = dict(_plain(data) or {})
    name = str(data.get("name", default_name))
    spec = TASKS.get(name)  # an unknown name: the registry's error, with the known names
    own = _plain(data.pop(name, None)) or {}
    if not isinstance(own, dict):
        raise ValueError(f"task.{name}: expected a section of settings (got {own!r})")
    own = dict(own)
    rest = [k for k in data if k not in common]
    old_record = any(k not in TASKS for k in rest)  # flat keys: written before the sections
    for key in rest:
        value = data.pop(key)
        if key in TASKS:
            _other_section(name, key, value, old_record)
        else:
            _flat_key(name, key, value, own, common)
    if spec.config is None:
        if own:
            raise ValueError(
                f"task.{name}.{sorted(own)[0]}: task.name={name} has no settings of its own"
            )
        return data
    try:
        data[name] = spec.config.model_validate(own)
    except ValidationError as exc:
        raise ValueError(nested_errors(f"task.{name}", exc)) from None
    return data
