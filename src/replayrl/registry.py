"""One registry class for every kind of plug-in: losses, advantages, batch sources, tasks,
rewards, samplers, generation backends and runtimes.

A registry maps names to entries. The config checks its names against it (an unknown one is
an error naming the config key, the registered names and the nearest ones), and the run looks
entries up by name, so no central module branches on a plug-in's name.

Entries are added by the modules that implement them. A registry may name `providers`,
modules imported the first time it is asked (so the config, at a low layer, is never checked
against a half-filled registry while the arrow of imports still points down), and every
registry loads the `replayrl.plugins` entry-point group once: an installed package declares

    [project.entry-points."replayrl.plugins"]
    my_plugin = "my_package.replayrl_plugin"

and that module (or, for `module:function`, that function, called with no arguments) adds
its entries to any registry. Torch-free: reading a config loads no model code.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["PLUGIN_GROUP", "Registry", "load_plugins"]

T = TypeVar("T")

PLUGIN_GROUP = "replayrl.plugins"

_plugins_state = {"loaded": False, "loading": False}


def load_plugins() -> None:
    """Import every `replayrl.plugins` entry point once (a callable one is called)."""
    if _plugins_state["loaded"] or _plugins_state["loading"]:
        return
    _plugins_state["loading"] = True  # a plugin's own imports may ask a registry again
    try:
        for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
            try:
                obj = ep.load()
                if callable(obj):
                    obj()
            except Exception as exc:
                raise ImportError(
                    f"replayrl plugin {ep.name!r} ({ep.value}) failed to load: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        _plugins_state["loaded"] = True
    finally:
        _plugins_state["loading"] = False


def reset_plugins() -> None:
    """Forget that the entry points were loaded (tests that install a fake one)."""
    _plugins_state["loaded"] = False


def nearest(name: str, names: list[str]) -> str:
    """'; did you mean a, b?' for the registered names closest to `name`, else ''."""
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


class Registry(Generic[T]):
    """Name -> entry. Registering a name twice and asking for an unknown one are errors; the
    latter names `config_key`, the registered names, the nearest ones and then `hint`."""

    def __init__(
        self, kind: str, config_key: str, providers: tuple[str, ...] = (), hint: str = ""
    ) -> None:
        self.kind, self.config_key, self.providers = kind, config_key, providers
        self.hint = hint
        self._entries: dict[str, T] = {}
        self._loading = False
        self._loaded = False

    def load(self) -> None:
        """Import the providers (once), then the installed plugins (once per process)."""
        if self._loading:
            return
        self._loading = True  # a provider's own imports may ask this registry again
        try:
            if not self._loaded:
                for module in self.providers:
                    importlib.import_module(module)
                self._loaded = True
            load_plugins()
        finally:
            self._loading = False

    def add(self, name: str, entry: T) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string (got {name!r})")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""

        def deco(entry: T) -> T:
            return self.add(name, entry)

        return deco

    def remove(self, name: str) -> None:
        """Unregister (a plugin's or a test's own entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        self.load()
        if name not in self._entries:
            known = sorted(self._entries)
            raise ValueError(
                f"{self.config_key}: unknown {self.kind} {name!r} (known: {', '.join(known)})"
                + nearest(str(name), known)
                + self.hint
            )
        return self._entries[name]

    def check(self, name: str) -> str:
        """`name` if registered, else the error `get` raises (for config validators)."""
        self.get(name)
        return name

    def items(self) -> list[tuple[str, T]]:
        self.load()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self.load()
        return len(self._entries)
