"""A generator worker: producing rollouts with the weights the learner last synced.

The same class runs in a local process (async-local) and inside a Ray actor (ray); only
the transport around it differs. With the HF backend the worker's model generates; with an
engine that holds its own weights (vLLM) synced weights go straight into the engine and the
worker keeps no copy of the policy (its module stays on the meta device: names and shapes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from replayrl.config.registries import BACKENDS
from replayrl.config.schema import Config
from replayrl.models.device import resolve_device
from replayrl.models.loading import unwrap_model
from replayrl.rollout.evaluation import evaluate_policy
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.tasks import task_from_config
from replayrl.run.components import build_generator, build_producer, reward_set
from replayrl.run.distributed.weights import SharedWeights, load_trainable
from replayrl.run.loops.pool import Delivery
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
        # train.device of this worker (its own GPU: see run/distributed/gpus.py)
        device = resolve_device(cfg.train.device)
        self.model, tokenizer, path = load_policy(
            cfg.model, cfg.task, log=log, seed=cfg.train.seed, device=device
        )
        self.model = self.model.to(device)
        torch.manual_seed(seed)  # after the (cached) warm start: sampling differs per worker
        self.model.eval()
        render = PromptRenderer(tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
        task = task_from_config(cfg.task)
        self.task, self.render = task, render  # for evaluations (`evaluate`)
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
        self.device = device  # where received weights are put (the engine's or model's)
        # an engine with weights of its own: synced tensors go into it, not into a model
        self.engine_fed = BACKENDS.get(cfg.rollout.backend).owns_weights
        if self.engine_fed:
            self._engine_names, self._lora_base = _engine_feed(self.model)
            self.model = self.model.to("meta")  # the policy's weights live in the engine only

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """The learner's trainable tensors of `version` (its parameter names)."""
        if self.engine_fed:
            self.producer.generator.load_weights(self._for_engine(state), version)
        else:
            load_trainable(self.model, state)
        self.version = version

    def pull(self, shared: SharedWeights) -> None:
        """The weights published in `shared` (async-local), if newer than those held."""
        self.version = shared.read(self.version, lambda state, v: self.set_weights(state, v))

    def _for_engine(self, state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """`state` under the engine's (plain model's) names; with LoRA, preceded by the base
        weights its adapters merge into (the engine gets merged weights)."""
        unknown = [n for n in state if n not in self._engine_names]
        if unknown:
            raise KeyError(f"weight sync: the worker's model has no parameter {unknown[0]!r}")
        yield from self._lora_base.items()
        for name, t in state.items():
            yield self._engine_names[name], t

    def evaluate(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """The held-out evaluation of the weights this worker holds, on `rows` (the learner's
        eval rows), with its own generator: a vLLM engine where it has one."""
        return evaluate_policy(self.cfg, self.producer.generator, self.task, rows, self.render)

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


def _engine_feed(model: torch.nn.Module) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(the model's parameter names -> the plain model's, which the engine takes; with LoRA,
    copies of the frozen weights of every block holding an adapter). A block's whole set
    goes with each sync because vLLM fuses q/k/v and gate/up into one layer, and a layer
    reloaded in part gets garbage in the rest."""
    inner = unwrap_model(model)
    plain = {id(p): n for n, p in inner.named_parameters()}
    names = {n: plain[id(p)] for n, p in model.named_parameters()}
    blocks = {
        # x.layers.0.self_attn.q_proj.base_layer.weight -> x.layers.0.self_attn
        n.split(".base_layer.")[0].rsplit(".", 1)[0]
        for n in plain.values()
        if ".base_layer." in n
    }
    base = {
        n: p.detach().clone()
        for n, p in inner.named_parameters()
        if not p.requires_grad and any(n.startswith(b + ".") for b in blocks)
    }
    return names, base


def now() -> float:
    return time.perf_counter()
