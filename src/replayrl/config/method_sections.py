"""Where a reuse method's settings go: `method: {name: NAME, NAME: {...}}`.

The `method` section names the reuse method (a `METHODS` entry) and holds each registered
method's own section (`method.remix.utd`, `method.exgrpo.ratio`), validated by the model the
method declares next to its code (`replayrl.methods`, or a plugin's module).

Before it, a method was spread over three places: `buffer.kind` (onpolicy | replay), the
`remix` section with its `enabled` switch, and `groups.source` with the sources' sections
under `groups`. Configs written so (run folders' config.yaml, checkpoint records, presets
and overrides of older releases) are still read: their keys are moved into `method`, with a
FutureWarning that names the new keys when they select a method.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from replayrl.config.registries import METHODS

DEFAULT_METHOD = "onpolicy"
# the methods the old switches selected; the group sources kept their names
_OLD_ONPOLICY, _OLD_REPLAY, _OLD_REMIX = "onpolicy", "replay", "remix"


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _old_choice(remix: Any, groups: Any, kind: Any) -> tuple[str | None, set[str]]:
    """(the method the old keys select, the methods they switch off): `remix.enabled=true`,
    `groups.source=NAME` and `buffer.kind=replay` select; `remix.enabled=false`,
    `groups.source=none` and `buffer.kind=onpolicy` only switch their own method off."""
    chosen: list[tuple[str, str]] = []
    off: set[str] = set()
    if isinstance(remix, Mapping) and "enabled" in remix:
        if remix["enabled"]:
            chosen.append(("remix.enabled=true", _OLD_REMIX))
        else:
            off.add(_OLD_REMIX)
    if isinstance(groups, Mapping) and groups.get("source") is not None:
        source = str(groups["source"])
        if source != "none":
            chosen.append((f"groups.source={source}", source))
        else:
            off |= {n for n in METHODS if n not in (_OLD_ONPOLICY, _OLD_REPLAY, _OLD_REMIX)}
    if kind == "replay":
        chosen.append(("buffer.kind=replay", _OLD_REPLAY))
    elif kind == "onpolicy":
        off.add(_OLD_REPLAY)
    elif kind is not None:
        raise ValueError(
            f"buffer.kind={kind}: the kind of buffer is the method's now: set method.name="
            f"{_OLD_ONPOLICY} (a queue) or method.name={_OLD_REPLAY} (a FIFO buffer)"
        )
    if len(chosen) > 1:
        keys = " and ".join(k for k, _ in chosen)
        raise ValueError(
            f"{keys} select two methods; a run has one: set method.name to one of "
            f"{', '.join(METHODS)} (its settings under method.<name>)"
        )
    return (chosen[0][1] if chosen else None), off


def place_method_keys(data: Any, fill_loss: bool = True) -> Any:
    """A config mapping with its method in `method` (old `remix`, `groups`, `buffer.kind`
    keys moved there: they win over `method`'s, as the later layer), and with `fill_loss`
    `algorithm.loss_type` set to the method's own loss when the mapping gives none.
    Anything but a mapping is returned as it is.

    Each layer of a config (a preset, a file, an override) is read so before it is merged
    (config/layering.py, config/overrides.py), so that a later layer wins in either layout."""
    if not isinstance(data, Mapping):
        return data
    data = dict(data)
    method = dict(_plain(data.get("method")) or {})
    remix = _plain(data.pop("remix", None))
    groups = _plain(data.pop("groups", None))
    buffer = _plain(data.get("buffer"))
    kind = None
    if isinstance(buffer, Mapping) and "kind" in buffer:
        buffer = dict(buffer)
        kind = buffer.pop("kind")
        data["buffer"] = buffer
    if remix is not None or groups is not None or kind is not None:
        chosen, off = _old_choice(remix, groups, kind)
        name = method.get("name")
        if chosen is not None:
            name = chosen
            own = chosen in METHODS and METHODS.get(chosen).config is not None
            warnings.warn(
                f"method.name={chosen}: the keys remix.enabled, groups.source and buffer.kind "
                "are now one key, method.name"
                + (
                    f", and the method's settings are under method.{chosen} (remix.* -> "
                    "method.remix.*, groups.NAME.* -> method.NAME.*)"
                    if own
                    else ""
                )
                + ": read as such",
                FutureWarning,
                stacklevel=4,
            )
        elif name in off:
            name = DEFAULT_METHOD
        if name is not None:
            method["name"] = name
        sections = dict(groups or {}) if isinstance(groups, Mapping) else {}
        sections.pop("source", None)
        if isinstance(remix, Mapping):
            sections[_OLD_REMIX] = {k: v for k, v in remix.items() if k != "enabled"}
        for key, given in sections.items():
            merged = dict(_plain(method.get(key)) or {})
            merged.update(_plain(given) or {})
            method[key] = merged
    if method:
        data["method"] = method
    if fill_loss and "name" in method:
        _method_loss(data, str(method["name"]))
    return data


def has_old_keys(data: Mapping[str, Any]) -> bool:
    """Whether a config mapping holds keys of the layout before `method`."""
    buffer = data.get("buffer")
    return "remix" in data or "groups" in data or (isinstance(buffer, Mapping) and "kind" in buffer)


def _method_loss(data: dict[str, Any], name: str) -> None:
    """The method's own loss where the config names none (a method preset is one block)."""
    if name not in METHODS:
        return  # the schema names the unknown method
    loss = METHODS.get(name).loss
    algorithm = _plain(data.get("algorithm"))
    if loss is None or (isinstance(algorithm, Mapping) and "loss_type" in algorithm):
        return
    data["algorithm"] = {**(algorithm if isinstance(algorithm, Mapping) else {}), "loss_type": loss}


def method_of(data: Mapping[str, Any]) -> str:
    """The method a config mapping selects, old keys read as `place_method_keys` does."""
    with warnings.catch_warnings():  # said once, when the config itself is validated
        warnings.simplefilter("ignore", FutureWarning)
        method = place_method_keys(data).get("method")
    name = method.get("name") if isinstance(method, Mapping) else None
    return str(name or DEFAULT_METHOD)


def legacy_keys() -> list[str]:
    """The dotted keys of the layout before `method` that are still read (`remix.utd`,
    `groups.source`, `groups.exgrpo.ratio`, `buffer.kind`), for the API's key check."""
    keys = ["buffer.kind", "groups.source", f"{_OLD_REMIX}.enabled"]
    for name in METHODS:
        section = METHODS.get(name).config
        if section is None:
            continue
        old = _OLD_REMIX if name == _OLD_REMIX else f"groups.{name}"
        keys += [f"{old}.{field}" for field in section.model_fields]
    return keys
