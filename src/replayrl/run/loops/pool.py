"""What the asynchronous learner and its generators exchange, wherever the generators run
(local processes: run/distributed/local.py; Ray actors: run/distributed/ray_runtime.py): a
`Delivery` is one batch a generator hands over, a `GeneratorPool` what the learner's loop
(run/loops/asynchronous.py) asks of the generators. The learner's loop and both transports
import it, so the loop needs nothing of a transport's: the runtimes sit above the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from replayrl.data.buffer.base import rollout_from_dict, rollout_to_dict
from replayrl.data.rollout_record import Rollout
from replayrl.storage.io import atomic_write_with
from replayrl.storage.safe_state import dumps_single, loads_single


@dataclass
class Delivery:
    """One batch a worker hands over: rollouts plus the counts the ledger and clocks need."""

    worker_id: int
    incarnation: int
    seq: int  # the worker incarnation's batch number
    version: int  # policy version that generated it
    rollouts: list[Rollout]
    stats: dict[str, float]
    generated: int
    tokens: int
    dropped_reward_error: int
    skipped_too_long: int
    first_error: str | None
    busy_s: float
    idle_s: float  # waiting since the previous batch (holds, pauses, weight loads)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """Plain data with the token tensors packed into three flat ones: (de)serialising a
        few big tensors is ~10x faster than hundreds of small ones."""
        d = dict(self.__dict__)
        d["rollouts"] = _pack(self.rollouts)
        return d

    @classmethod
    def from_plain(cls, d: dict[str, Any]) -> Delivery:
        return cls(**{**d, "rollouts": _unpack(d["rollouts"])})

    def save(self, path: Path) -> None:
        """Atomic: a worker killed mid-write leaves only a temporary file. The format is
        safetensors with the JSON structure in its header (safe_state): loading it runs no
        code, at about pickle's speed (benchmarks/spool_bench.py: 1.16x pickle's save+load
        for 64 rollouts, where torch.load(weights_only=True) took 1.77x)."""
        data = dumps_single(self.to_plain())
        # no fsync: the spool only has to survive a killed worker, and it is written often
        atomic_write_with(path, lambda tmp: tmp.write_bytes(data), fsync=False)

    @classmethod
    def load(cls, path: Path) -> Delivery:
        return cls.from_plain(loads_single(path.read_bytes(), name=str(path)))


_PACKED = ("prompt_ids", "completion_ids", "behaviour_logprobs")


def _pack(rollouts: list[Rollout]) -> dict[str, Any]:
    out: dict[str, Any] = {"meta": []}
    for name in _PACKED:
        ts = [getattr(r, name) for r in rollouts]
        out[name] = torch.cat(ts) if ts else torch.zeros(0)
        out[f"{name}_len"] = [t.numel() for t in ts]
    for r in rollouts:
        meta = rollout_to_dict(r)
        for name in _PACKED:
            del meta[name]
        out["meta"].append(meta)
    return out


def _unpack(packed: dict[str, Any]) -> list[Rollout]:
    parts = {
        name: [t.clone() for t in torch.split(packed[name], packed[f"{name}_len"])]
        for name in _PACKED
    }
    return [
        rollout_from_dict({**meta, **{name: parts[name][i] for name in _PACKED}})
        for i, meta in enumerate(packed["meta"])
    ]


class GeneratorPool(Protocol):
    """What the learner needs from its generators, wherever they run."""

    lost: int

    def start(self) -> None: ...
    def publish(self, model: Any, version: int) -> None: ...
    def poll(self) -> list[Delivery]: ...
    def check(self) -> list[Delivery]: ...
    def set_hold(self, hold: bool) -> None: ...
    def pause(self, paused: bool) -> None: ...
    def stop(self) -> list[Delivery]: ...
    def pids(self) -> dict[str, int]: ...
    def restarts(self) -> dict[str, int]: ...
