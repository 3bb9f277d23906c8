"""A config as layers: defaults <- experiment <- method <- files <- command line.

A method preset (`grpo`, `replay`, `remix-grpo`, ...) holds only the method's keys (buffer,
groups, loss, KL, ReMix, its steps and evaluation grid). The experiment it runs on is a layer
of its own (config/experiments): `demo` (the built-in tiny model on 2-digit addition, warm
start, 6-token completions, the tiny model's learning rate) is put under a method preset when
the model is the built-in tiny one, and `trl-defaults` (TRL's GRPOConfig values for the
completion length, learning rate and batch) when `model.path` names a real model. A layer is
also named after a `+`: `--config replay+demo`. A preset that sets the model or the task
(`demo`, `smollm2-gsm`, ...) is a whole experiment and gets no layer under it.

Each value's source (`replayrl config show --sources`) is one of SOURCES.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from replayrl.config.catalog import PRESETS, UnknownNameError, resolve_preset
from replayrl.config.method_sections import place_method_keys
from replayrl.config.overrides import ConfigError, apply_overrides, load_yaml

EXPERIMENTS = "experiments"
DEMO = "demo"
TRL_DEFAULTS = "trl-defaults"
# sections whose presence makes a preset an experiment rather than a method
EXPERIMENT_KEYS = ("model", "task", "rewards")
SOURCES = ("default", "default (TRL)", "experiment", "method", "file", "command line")


@dataclass(frozen=True)
class Layer:
    """One YAML mapping of a config and what it counts as (one of SOURCES)."""

    name: str
    source: str
    data: Mapping[str, Any]


def _experiments_folder() -> Path:
    return Path(str(resources.files("replayrl.config") / EXPERIMENTS))


def experiment_names() -> list[str]:
    """Names of the shipped experiment layers (`replay+demo`)."""
    return sorted(p.stem for p in _experiments_folder().glob("*.yaml"))


def _shipped_preset(path: Path) -> bool:
    folder = Path(str(resources.files("replayrl.config") / PRESETS)).resolve()
    return path.resolve().parent == folder


def is_method(data: Mapping[str, Any]) -> bool:
    """A method preset sets neither the model, nor the task, nor the rewards."""
    return not any(k in data for k in EXPERIMENT_KEYS)


def experiment_layer(name: str) -> Layer:
    """A shipped experiment layer by name (`demo`, `trl-defaults`)."""
    path = _experiments_folder() / f"{name}.yaml"
    source = "default (TRL)" if name == TRL_DEFAULTS else "experiment"
    return Layer(name, source, load_yaml(path))


def _part(text: str, first: bool) -> Layer:
    """A `+`-separated part: a file or preset (first), else an experiment name first."""
    if not first and text in experiment_names() and not Path(text).is_file():
        return experiment_layer(text)
    try:
        path = resolve_preset(text)
    except UnknownNameError as exc:
        extra = "" if first else f" (experiments: {', '.join(experiment_names())})"
        raise ConfigError(f"{exc}{extra}") from None
    data = load_yaml(path)
    if not _shipped_preset(path):
        return Layer(str(text), "file", data)
    data = anchor_files(data, path.resolve().parent)
    return Layer(path.stem, "method" if is_method(data) else "experiment", data)


def _anchored(ref: Any, folder: Path) -> Any:
    """`ref` (a path, or `file.py:function`) made absolute when it names a file shipped in
    `folder`; anything else as it is."""
    if not isinstance(ref, str) or not ref or Path(ref).is_absolute():
        return ref
    file, sep, fn = ref.partition(":") if ref.split(":", 1)[0].endswith(".py") else (ref, "", "")
    shipped = folder / file
    return f"{shipped}{sep}{fn}" if shipped.is_file() else ref


def _anchored_files(section: dict[str, Any], folder: Path) -> dict[str, Any]:
    return {
        k: _anchored(v, folder) if k in ("path", "eval_path") else v for k, v in section.items()
    }


def anchor_files(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A shipped preset's data and reward files (`task.dataset.path: data/easy_math.jsonl`, a
    reward `rewards/answer_format.py:fn`) are relative to the preset's own folder, so the
    preset runs from any folder of a pip install."""
    data = dict(data)
    task = data.get("task")
    if isinstance(task, dict):
        # a task's files are in its own section (task.dataset.path); flat: the old layout
        data["task"] = {
            k: _anchored_files(v, folder) if isinstance(v, dict) else v
            for k, v in _anchored_files(task, folder).items()
        }
    rewards = data.get("rewards")
    if isinstance(rewards, list):
        data["rewards"] = [
            {**r, "name": _anchored(r.get("name"), folder)} if isinstance(r, dict) else r
            for r in rewards
        ]
    return data


def file_layers(spec: str | Path | None) -> list[Layer]:
    """The layers a `--config` value names: `replay`, `replay+demo`, `my.yaml`, None."""
    if spec is None:
        return []
    text = str(spec)
    if "+" not in text or Path(text).expanduser().is_file():
        return [_part(text, True)]
    return [_part(p.strip(), i == 0) for i, p in enumerate(text.split("+"))]


def merge(
    into: dict[str, Any],
    data: Mapping[str, Any],
    source: str,
    sources: dict[str, str],
    prefix: str = "",
) -> None:
    """Deep-merge `data` into `into` (sections merge, values replace), recording each value's
    dotted key -> `source`."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge(into[key], value, source, sources, f"{dotted}.")
            continue
        if isinstance(value, Mapping):
            into[key] = {}
            merge(into[key], value, source, sources, f"{dotted}.")
            if not value:
                sources[dotted] = source
            continue
        into[key] = value
        for old in [k for k in sources if k.startswith(f"{dotted}.")]:
            del sources[old]
        sources[dotted] = source


def _method_layout(layer: Layer) -> dict[str, Any]:
    """A layer's data with its method in `method` (config/method_sections.py)."""
    try:
        return dict(place_method_keys(layer.data))
    except ValueError as exc:
        raise ConfigError(f"{layer.name}: {exc}") from None


def auto_layer(layers: Iterable[Layer], model_path: Any) -> Layer | None:
    """The experiment put under method presets that name none: `demo` for the built-in tiny
    model, TRL's defaults for a real one; None when a layer already is an experiment or no
    shipped method preset is among them."""
    layers = list(layers)
    if not any(layer.source == "method" for layer in layers):
        return None
    if any(layer.source == "experiment" for layer in layers):
        return None
    return experiment_layer(DEMO if model_path is None else TRL_DEFAULTS)


def layered(
    spec: str | Path | None, model_path: Any = None, overrides: Iterable[str] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """(data, dotted key -> source) of the layers `spec` names with the experiment put under
    them for `model_path` (the final `model.path`: None = the tiny model). `overrides` only
    decide the model when `model_path` is None; they are not applied."""
    layers = file_layers(spec)
    if model_path is None:
        top: dict[str, Any] = {}
        for layer in layers:
            merge(top, _method_layout(layer), layer.source, {})
        model = apply_overrides(top, list(overrides)).get("model")
        model_path = model.get("path") if isinstance(model, dict) else None
    extra = auto_layer(layers, model_path)
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in ([extra] if extra is not None else []) + layers:
        # each layer's method in `method` (an older file's remix / groups / buffer.kind
        # moved there, with the method's own loss where the layer names none)
        merge(data, _method_layout(layer), layer.source, sources)
    return data, sources


def resolve(
    spec: str | Path | None, overrides: Iterable[str] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """(config data, dotted key -> source) for `--config spec` and `key=value` overrides.
    A key in no layer has the schema's default."""
    overrides = list(overrides)
    data, sources = layered(spec, None, overrides)
    apply_overrides(data, overrides)  # a section given whole replaces the section
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        for old in [k for k in sources if k.startswith(f"{key}.")]:
            del sources[old]
        sources[key] = "command line"
    return data, sources


def _leaves(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict) and data:
        return [kv for k, v in data.items() for kv in _leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), data)]


def source_of(key: str, sources: Mapping[str, str]) -> str:
    """The source of dotted `key` (that of the section set whole above it; else default)."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:i]))
        if found is not None:
            return found
    return "default"


def format_sources(cfg: Any, spec: str | Path | None, overrides: Iterable[str]) -> str:
    """Every key of the resolved `cfg` with its value and source, one a line."""
    import json

    _, sources = resolve(spec, overrides)
    rows = _leaves(cfg.model_dump(mode="json"))
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {json.dumps(v):<24}  {source_of(k, sources)}\n" for k, v in rows)
