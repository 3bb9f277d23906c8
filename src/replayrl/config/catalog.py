"""Presets and bench suites shipped inside the package (src/replayrl/config/presets and
suites).

A config or suite is given by name (`remix-grpo`, `default`) or by path. Resolution order:
an existing file path wins; otherwise a bare name (with or without `.yaml`) is looked up
among the shipped files; otherwise the error lists what is shipped. This works from any
folder after `pip install replayrl`, without a source checkout.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

PRESETS = "presets"
SUITES = "suites"


class UnknownNameError(FileNotFoundError):
    """Neither an existing file nor a shipped preset / suite name."""


def _folder(kind: str) -> Path:
    # a regular (non-zip) install: files() is a real folder on disk
    return Path(str(resources.files("replayrl.config") / kind))


def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in _folder(kind).glob("*.yaml"))


def preset_names() -> list[str]:
    """Names of the shipped presets (`replayrl presets` lists them)."""
    return _names(PRESETS)


def suite_names() -> list[str]:
    """Names of the shipped bench suites."""
    return _names(SUITES)


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = str(name_or_path)
    stem = text[:-5] if text.endswith(".yaml") else text
    if "/" not in stem and "\\" not in stem:
        shipped = _folder(kind) / f"{stem}.yaml"
        if shipped.is_file():
            return shipped
    label = "preset" if kind == PRESETS else "bench suite"
    names = _names(kind)
    close = difflib.get_close_matches(stem, names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UnknownNameError(
        f"{label} {text!r} not found: no such file, and not a shipped {label} name "
        f"({hint}shipped: {', '.join(names) or '(none)'})"
    )


def resolve_preset(name_or_path: str | Path) -> Path:
    """The YAML file of a config: an existing path, or a shipped preset's name."""
    return _resolve(PRESETS, name_or_path)


def resolve_suite(name_or_path: str | Path) -> Path:
    """The YAML file of a bench suite: an existing path, or a shipped suite's name."""
    return _resolve(SUITES, name_or_path)


def description(path: Path) -> str:
    """The first paragraph of a YAML file's leading comment (its description), as one line
    without `# `: a sentence that runs over several comment lines is given whole."""
    lines: list[str] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped and not lines:
            continue
        text = stripped.lstrip("#").strip()
        if not stripped.startswith("#") or not text:  # the paragraph (or the comment) ends
            break
        lines.append(text)
    return " ".join(lines)


def listing(kind: str = PRESETS) -> list[tuple[str, str]]:
    """(name, one-line description) of every shipped preset (or suite)."""
    return [(p.stem, description(p)) for p in sorted(_folder(kind).glob("*.yaml"))]
