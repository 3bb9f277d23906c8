"""A generator worker: its own copy of the policy, producing rollouts with synced weights.

The same class runs in a local process (async-local) and inside a Ray actor (ray); only
the transport around it differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replayrl.config.schema import Config
from replayrl.data.buffer.base import rollout_from_dict, rollout_to_dict
from replayrl.data.rollout import Rollout
from replayrl.distributed.weights import load_trainable
from replayrl.models.device import resolve_device
from replayrl.models.loading import unwrap_model
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.tasks import task_from_config
from replayrl.run.components import build_generator, build_producer, reward_set
from replayrl.run.policy import load_policy
from replayrl.storage.io import atomic_write_with
from replayrl.storage.safe_state import dumps_single, loads_single

Log = Callable[[str], None]


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


def worker_seed(cfg: Config, worker_id: int, incarnation: int) -> int:
    """Distinct prompt/sampling streams per worker and per restart."""
    return cfg.train.seed + 7919 * (worker_id + 1) + 104_729 * incarnation


class GeneratorWorker:
    """Builds model, task, rewards and producer from the run's config; weights come by sync."""

    def __init__(self, cfg: Config, worker_id: int, incarnation: int = 0, log: Log = print):
        self.cfg, self.worker_id, self.incarnation = cfg, worker_id, incarnation
        torch.set_num_threads(cfg.workers.generator_threads)
        seed = worker_seed(cfg, worker_id, incarnation)
        rewards = reward_set(cfg)  # before the model: see run.components.reward_set
        # train.device of this worker (its own GPU: see distributed/gpus.py)
        device = resolve_device(cfg.train.device)
        self.model, tokenizer, path = load_policy(
            cfg.model, cfg.task, log=log, seed=cfg.train.seed, device=device
        )
        self.model = self.model.to(device)
        torch.manual_seed(seed)  # after the (cached) warm start: sampling differs per worker
        self.model.eval()
        render = PromptRenderer(tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
        task = task_from_config(cfg.task)
        # a vLLM engine's seed: train.seed + this worker's offset (its own sampling noise)
        generator = build_generator(
            cfg, self.model, tokenizer, path, task, render, worker_offset=seed - cfg.train.seed
        )
        self.producer = build_producer(
            cfg,
            self.model,
            tokenizer,
            path,
            np.random.default_rng(seed),
            log,
            task=task,
            rewards=rewards,
            generator=generator,
            render=render,
        )
        self.version = -1  # no weights yet: the learner publishes before anything is generated
        self.seq = 0

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        load_trainable(self.model, state)
        self.after_weights(version)

    def after_weights(self, version: int) -> None:
        """The model holds `version`; an engine with its own copy (vLLM) gets it too."""
        gen = self.producer.generator
        if hasattr(gen, "load_weights"):
            gen.load_weights(unwrap_model(self.model).named_parameters(), version)
        self.version = version

    @property
    def planned(self) -> int:
        """Rollouts the next batch will sample (what is lost if the worker dies mid-batch)."""
        return self.cfg.rollouts_per_step

    def produce(self, idle_s: float) -> Delivery:
        self.seq += 1
        key = self.incarnation * 64 + self.worker_id + 1
        p = self.producer.produce(
            self.version, step=self.version, group_base=1_000_000 * (self.seq * 4096 + key)
        )
        return Delivery(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            seq=self.seq,
            version=self.version,
            rollouts=p.rollouts,
            stats=p.stats,
            generated=p.generated,
            tokens=p.tokens,
            dropped_reward_error=p.dropped_reward_error,
            skipped_too_long=p.skipped_too_long,
            first_error=p.first_error,
            busy_s=p.seconds,
            idle_s=idle_s,
            extra={
                "dropped_reward_timeout": p.dropped_reward_timeout,
                "reward_seconds": p.reward_seconds,
            },
        )


def now() -> float:
    return time.perf_counter()
