"""Load a user reward function from `path/to/file.py:name` or `package.module:name`."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


class RewardLoadError(ValueError):
    """A reward function spec that cannot be resolved; the message names the spec."""


def _split_spec(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or ":" not in spec:
        raise RewardLoadError(
            f"reward function {spec!r}: expected 'path/to/file.py:function_name' or "
            "'package.module:function_name'"
        )
    target, _, name = spec.strip().rpartition(":")  # rpartition: `C:\dir\f.py:fn` works
    target, name = target.strip(), name.strip()
    if not target or not name:
        raise RewardLoadError(
            f"reward function {spec!r}: both the module (or file) and the function name are "
            "needed, as in 'rewards.py:my_reward'"
        )
    return target, name


def _is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _import_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise RewardLoadError(f"reward function {spec!r}: file not found: {path}")
    resolved = path.resolve()
    # a unique, stable module name per file, so two `rewards.py` in different folders coexist
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_name = f"replayrl_user_rewards_{resolved.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    mod_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if mod_spec is None or mod_spec.loader is None:
        raise RewardLoadError(f"reward function {spec!r}: cannot import {path} as Python")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[module_name] = module  # needed by dataclasses / pickling inside the file
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise RewardLoadError(
            f"reward function {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _import_module(target: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise RewardLoadError(
            f"reward function {spec!r}: module {target!r} not found ({exc}); "
            "for a file, give its path ending in .py"
        ) from exc
    except Exception as exc:
        raise RewardLoadError(
            f"reward function {spec!r}: importing {target!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def load_reward_function(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """The callable named by `file.py:name` or `package.module:name` (relative to base_dir)."""
    target, name = _split_spec(spec)
    if _is_file_target(target):
        path = Path(target).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        module = _import_file(path, spec)
    else:
        module = _import_module(target, spec)
    try:
        fn = getattr(module, name)
    except AttributeError:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        hint = f" (callables there: {', '.join(public)})" if public else ""
        raise RewardLoadError(
            f"reward function {spec!r}: {target} has no attribute {name!r}{hint}"
        ) from None
    if not callable(fn):
        raise RewardLoadError(
            f"reward function {spec!r}: {name!r} in {target} is a {type(fn).__name__}, "
            "not a callable"
        )
    return fn
