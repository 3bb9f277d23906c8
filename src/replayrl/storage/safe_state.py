"""Save and load nested plain state without pickle: tensors in safetensors, the rest in JSON.

Loading a pickle executes whatever code the file names, so a checkpoint or spool file that
someone hands you could run code on your machine. Here a state (dicts, lists, tuples,
numbers, strings, None, torch tensors, numpy arrays and numpy RNG states) is split into:

- ``<name>.safetensors``: every tensor, keyed ``t0, t1, ...`` (safetensors only holds raw
  numbers, so loading it cannot run code);
- ``<name>.json``: the structure, with each tensor replaced by ``{"__tensor__": "t0"}``,
  tuples by ``{"__tuple__": [...]}``, dicts whose keys are not all strings (optimizer state
  is keyed by parameter index) by ``{"__items__": [[k, v], ...]}``, numpy arrays by
  ``{"__ndarray__": {dtype, shape, base64}}``.

Any other type raises ``TypeError`` naming where in the state it sits, at save time.
"""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

_MARKERS = ("__tensor__", "__tuple__", "__items__", "__ndarray__", "__float__")


# a state JSON is read only within these limits: a file edited to nest 200,000 lists deep
# or to be absurdly large is a clear error, not a RecursionError or an exhausted memory
MAX_DEPTH = 100
MAX_JSON_BYTES = 8 << 30


class StateFormatError(ValueError):
    """A state file that is not what `save_state` writes (truncated, edited, another format)."""


def _float(x: float) -> Any:
    # JSON has no NaN/inf; keep them exact instead of silently turning them into null
    return x if math.isfinite(x) else {"__float__": repr(x)}


def encode(obj: Any, tensors: dict[str, torch.Tensor], where: str = "state") -> Any:
    """`obj` as JSON-ready data; tensors are moved into `tensors` (CPU, contiguous)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _float(float(obj))
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {
            "__ndarray__": {
                "dtype": a.dtype.str,
                "shape": list(a.shape),
                "data": base64.b64encode(a.tobytes()).decode("ascii"),
            }
        }
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _MARKERS for k in obj):
            return {k: encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {
            "__items__": [
                [encode(k, tensors, f"{where} key"), encode(v, tensors, f"{where}[{k!r}]")]
                for k, v in obj.items()
            ]
        }
    raise TypeError(
        f"{where}: a {type(obj).__name__} cannot be saved without pickle (plain data, "
        "tensors and numpy arrays only)"
    )


def decode(data: Any, tensors: dict[str, torch.Tensor], depth: int = 0) -> Any:
    """Inverse of `encode`; StateFormatError past MAX_DEPTH levels of nesting."""
    if depth > MAX_DEPTH:
        raise StateFormatError(f"state nested more than {MAX_DEPTH} levels deep (edited?)")
    d = depth + 1
    if isinstance(data, list):
        return [decode(v, tensors, d) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        ((key, value),) = data.items()
        if key == "__tensor__":
            if value not in tensors:
                raise StateFormatError(f"tensor {value!r} is missing from the tensor file")
            return tensors[value]
        if key == "__tuple__":
            return tuple(decode(v, tensors, d) for v in value)
        if key == "__items__":
            return {_hashable(decode(k, tensors, d)): decode(v, tensors, d) for k, v in value}
        if key == "__float__":
            return float(value)
        if key == "__ndarray__":
            dtype = np.dtype(value["dtype"])
            if dtype.kind not in "biufc":  # plain numbers only (no object arrays)
                raise StateFormatError(f"array of dtype {dtype} is not plain numbers")
            raw = base64.b64decode(value["data"])
            return np.frombuffer(raw, dtype=dtype).reshape(value["shape"]).copy()
    return {k: decode(v, tensors, d) for k, v in data.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(x) for x in k) if isinstance(k, (list, tuple)) else k


def dumps(state: Any) -> tuple[bytes, bytes]:
    """(JSON bytes, safetensors bytes) for `state`."""
    tensors: dict[str, torch.Tensor] = {}
    tree = encode(state, tensors)
    _unshare(tensors)
    text = json.dumps({"format": "replayrl-state", "version": 1, "state": tree}, allow_nan=False)
    return text.encode(), st_save(tensors)


def _unshare(tensors: dict[str, torch.Tensor]) -> None:
    """safetensors refuses tensors that share memory (views of one another): copy those."""
    seen: set[int] = set()
    for key, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or not t.is_contiguous() or t.numel() == 0:
            tensors[key] = t.contiguous().clone()
        seen.add(ptr)


def loads(text: bytes, blob: bytes, name: str = "state") -> Any:
    """Rebuild a state from `dumps` output; StateFormatError if either part is damaged."""
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFormatError(f"{name}.json is not valid JSON (truncated?): {exc}") from None
    except RecursionError:
        raise StateFormatError(f"{name}.json is nested too deeply to read (edited?)") from None
    if not isinstance(doc, dict) or doc.get("format") != "replayrl-state":
        raise StateFormatError(f"{name}.json is not a replayrl state file")
    try:
        tensors = st_load(blob)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise StateFormatError(
            f"{name}.safetensors is not a valid safetensors file (truncated?): {exc}"
        ) from None
    return decode(doc["state"], tensors)


def _write_bytes(path: Path, data: bytes, fsync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def save_state(folder: Path, name: str, state: Any, fsync: bool = True) -> list[Path]:
    """Write `<folder>/<name>.json` and `<name>.safetensors` (not atomic: callers write into
    a temporary folder or file name and rename it into place)."""
    text, blob = dumps(state)
    paths = [folder / f"{name}.safetensors", folder / f"{name}.json"]
    _write_bytes(paths[0], blob, fsync)
    _write_bytes(paths[1], text, fsync)
    return paths


def load_state_files(folder: Path, name: str) -> Any:
    """Read what `save_state` wrote; never unpickles anything."""
    js, st = folder / f"{name}.json", folder / f"{name}.safetensors"
    for p in (js, st):
        if not p.is_file():
            raise StateFormatError(f"{p} is missing")
    if js.stat().st_size > MAX_JSON_BYTES:
        raise StateFormatError(f"{js} is larger than {MAX_JSON_BYTES >> 30} GiB (not a state)")
    return loads(js.read_bytes(), st.read_bytes(), name=str(folder / name))


_META_KEY = "replayrl-state"


def dumps_single(state: Any) -> bytes:
    """One safetensors blob whose header metadata holds the JSON structure (for small
    states such as a spool file: one file, so one atomic rename)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = encode(state, tensors)
    _unshare(tensors)
    text = json.dumps({"format": "replayrl-state", "version": 1, "state": tree}, allow_nan=False)
    return st_save(tensors, metadata={_META_KEY: text})


def loads_single(blob: bytes, name: str = "state") -> Any:
    """Inverse of `dumps_single`; StateFormatError if the blob is damaged."""
    try:
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8 : 8 + n])
        text = header["__metadata__"][_META_KEY]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateFormatError(f"{name} is not a replayrl state file (truncated?): {exc}") from None
    try:
        tensors = st_load(blob)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise StateFormatError(f"{name} is damaged (truncated?): {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateFormatError(f"{name}: damaged metadata: {exc}") from None
    except RecursionError:
        raise StateFormatError(f"{name}: metadata nested too deeply to read") from None
    return decode(doc["state"], tensors)
