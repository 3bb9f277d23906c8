"""A generator worker: its own copy of the policy, producing rollouts with synced weights.

The same class runs in a local process (async-local) and inside a Ray actor (ray); only
the transport around it differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from replayrl.config.schema import Config
from replayrl.distributed.weights import load_trainable
from replayrl.models.device import resolve_device
from replayrl.models.loading import unwrap_model
from replayrl.recipes.pool import Delivery
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.tasks import task_from_config
from replayrl.run.components import build_generator, build_producer, reward_set
from replayrl.run.policy import load_policy

Log = Callable[[str], None]


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
                "dropped_no_reward": p.dropped_no_reward,
            },
        )


def now() -> float:
    return time.perf_counter()
