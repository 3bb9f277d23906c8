"""The registries that the config's method and task names are checked against.

`BATCH_SOURCES` (groups.source: where each step's training batch comes from: a buffer,
DAPO's dynamic sampling, AR3PO, ExGRPO, RePO, ...) and `TASKS` (task.name) live here, at the
config's layer, so the schema can list and validate what they hold. Their entries are added
by the layers that implement them (`replayrl.data.sources`, `replayrl.rollout.tasks`): the
arrow of registration points down. The registry imports those provider packages by name the
first time it is asked (a plugin lookup, as a Python entry point would be), so a config is
never checked against a half-filled registry.

A new reuse method is one file that defines its config section (a `Section`), its check over
the whole config, its builder and its metrics, and one `BATCH_SOURCES.add(...)` line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from replayrl.config.section import Section

T = TypeVar("T")


class PluginRegistry(Generic[T]):
    """Name -> entry, filled by `providers` (module names) imported on first use; registering
    a name twice and asking for an unknown one are errors naming the config key. (The same
    contract as `replayrl.algorithms.registry.Registry`, kept torch-free here: reading a
    config must not load the algorithms package.)"""

    def __init__(self, kind: str, config_key: str, providers: tuple[str, ...]) -> None:
        self.kind, self.config_key, self.providers = kind, config_key, providers
        self._entries: dict[str, T] = {}
        self._loading = False
        self._loaded = False

    def load(self) -> None:
        if self._loaded or self._loading:
            return
        self._loading = True  # a provider's own imports may ask this registry again
        try:
            for module in self.providers:
                importlib.import_module(module)
            self._loaded = True
        finally:
            self._loading = False

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Unregister (a plugin's or a test's own entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        self.load()
        if name not in self._entries:
            raise ValueError(
                f"{self.config_key}: unknown {self.kind} {name!r} (known: {', '.join(self)})"
            )
        return self._entries[name]

    def check(self, name: str) -> str:
        """`name` if registered, else the error `get` raises (for config validators)."""
        self.get(name)
        return name

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self.load()
        return len(self._entries)


@dataclass(frozen=True)
class BatchSourceSpec:
    """A reuse method as the run sees it.

    build: `(SourceContext) -> BatchSource` (`replayrl.data.sources.base`).
    config: its section, under `groups.<name>` (None: it has no settings of its own).
    check: `(Config) -> None`, raising ValueError for settings it cannot run with (the
        runtime, the buffer, the batch size...); called when the config selects it.
    metrics: the run counters it adds to (`replayrl.run.state.Counters` fields, reported in
        summary.json and listed by `replayrl presets`).
    summary: one line for `replayrl presets`, the docs and error messages.
    frozen_on_resume: the keys its checkpointed state depends on (a store's bounds, a prompt
        pool's size), which a resume may not change: names in its `groups.<name>` section, or
        full dotted keys. Any other key of its section must resume and train.
    ledger: (counter, ledger term, phrase in the end-of-run report) for those of its counters
        that count generated rollouts never pushed to a buffer, so the rollout ledger balances.
    """

    build: Callable[[Any], Any]
    config: type[Section] | None = None
    check: Callable[[Any], None] | None = None
    metrics: tuple[str, ...] = ()
    summary: str = ""
    frozen_on_resume: tuple[str, ...] = ()
    ledger: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    """A task as the run sees it: `build(TaskConfig) -> Task`; `make(**kwargs) -> Task` for
    `make_task`; `check(TaskConfig)` raises ValueError for settings it cannot run with.

    For the built-in tiny model's warm start (run/warmstart.py): `warmstart_fields`, the
    `task.*` keys its cached warm start depends on (None: all of them), and `tiny_check`,
    which refuses settings that warm start cannot give a usable start policy for.
    `frozen_on_resume`: the `task.*` keys a resume may not change (its checkpointed state
    depends on them)."""

    build: Callable[[Any], Any]
    make: Callable[..., Any]
    check: Callable[[Any], None] | None = None
    summary: str = ""
    warmstart_fields: frozenset[str] | None = None
    tiny_check: Callable[[Any], None] | None = None
    frozen_on_resume: tuple[str, ...] = ()


BATCH_SOURCES: PluginRegistry[BatchSourceSpec] = PluginRegistry(
    "batch source", "groups.source", ("replayrl.data.sources",)
)
TASKS: PluginRegistry[TaskSpec] = PluginRegistry("task", "task.name", ("replayrl.rollout.tasks",))
