"""Config files and dotted overrides as plain mappings: reading a YAML file (a path or a
shipped preset's name) and setting `a.b.c=value` keys, before validation (schema.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from replayrl.config.catalog import UnknownNameError, resolve_preset
from replayrl.config.method_sections import has_old_keys, place_method_keys


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and the value."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (['a','b','c'], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted key in a nested dict (creating sections as needed). A key of the
    layout before `method` (`remix.utd=3`, `groups.source=ar3po`, `buffer.kind=replay`) is
    moved into `method` at once, so that it wins over what the layers below set there."""
    for text in overrides:
        path, value = parse_override(text)
        set_dotted(data, path, value, text)
        if has_old_keys(data):
            try:
                moved = place_method_keys(data, fill_loss=False)
            except ValueError as exc:
                raise ConfigError(f"override {text!r}: {exc}") from None
            data.clear()
            data.update(moved)
    return data


def set_dotted(data: dict[str, Any], path: list[str], value: Any, text: str) -> None:
    """data[a][b] = value for path [a, b], creating sections as needed; `text`: the override
    as the user wrote it, for the error when a part of the path is a value."""
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {text!r}: {'.'.join(path[: i + 1])} is a value, not a section"
            )
        node = child
    node[path[-1]] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML file: an existing path, or a shipped preset's name (`grpo`)."""
    try:
        p = resolve_preset(path)
    except UnknownNameError as exc:
        raise ConfigError(str(exc)) from None
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data
