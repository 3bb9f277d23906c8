"""A named registry: the config accepts exactly what is registered (and says what is)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry; registering a name twice and asking for an unknown one are errors."""

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind, self.config_key = kind, config_key
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        def deco(entry: T) -> T:
            return self.add(name, entry)

        return deco

    def remove(self, name: str) -> None:
        """Unregister (a plugin's or a test's own entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
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
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
