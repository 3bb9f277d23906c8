"""Every runtime's parts, built from the config in one place (torchtune's recipe/components
split): policy, task, rewards, producer, learner, buffers and the batch source.

The synchronous session, the asynchronous generator workers (local processes and Ray
actors) and Ray's follower learners all build what they need here, so a run's parts are the
same whichever runtime drives them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from replayrl.algorithms import ADVANTAGES
from replayrl.config.registries import BACKENDS, METHODS
from replayrl.config.schema import Config
from replayrl.data.buffer import Buffer, make_buffer
from replayrl.learner.critic import ValueModel
from replayrl.learner.learner import Learner
from replayrl.methods.base import SourceContext
from replayrl.methods.buffer import BatchSource
from replayrl.models.device import model_device, resolve_device
from replayrl.models.loading import unwrap_model
from replayrl.rollout.context_bound import longest_prompt_tokens
from replayrl.rollout.evaluation import held_out_rows, rows_that_fit, too_long_note
from replayrl.rollout.generation import Generator, make_generator
from replayrl.rollout.generation.base import WeightOwner
from replayrl.rollout.producer import RolloutProducer
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.rewards import prepare_isolation, resolve_rewards
from replayrl.rollout.tasks import task_from_config
from replayrl.run.policy import load_policy

Log = Callable[[str], None]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def buffer_kwargs(cfg: Config) -> dict[str, Any]:
    """`make_buffer` keyword arguments from the config (shared with Ray's buffer actors)."""
    b = cfg.buffer
    return dict(
        sampler=b.sampler,
        delta=b.delta,
        with_replacement=b.with_replacement,
        num_shards=b.num_shards,
        max_staleness=b.max_staleness,
        seed=cfg.train.seed,
    )


def build_buffer(cfg: Config) -> Buffer:
    kind = METHODS.get(cfg.method.name).buffer  # the method's kind of buffer
    return make_buffer(kind, cfg.buffer.capacity, **buffer_kwargs(cfg))  # type: ignore[arg-type]


def build_batch_source(
    cfg: Config,
    buffer: Buffer,
    producer: RolloutProducer | None = None,
    learner: Learner | None = None,
) -> BatchSource:
    """The batch source of the method `method.name` names (its `METHODS` entry's builder).
    `producer` / `learner`: the run's own, for sources that generate more within a step or
    score stored responses (without them a source does what it can: unit tests)."""
    spec = METHODS.get(cfg.method.name)
    return spec.build(SourceContext(cfg, buffer, producer, learner))  # type: ignore[no-any-return]


def build_learner(cfg: Config, model: Any, pad_id: int, model_path: str) -> Learner:
    """The learner, with a critic initialised from the policy when the advantage needs one."""
    critic = (
        ValueModel.from_pretrained(model_path)
        if ADVANTAGES.get(cfg.algorithm.advantage).needs_critic
        else None
    )
    return Learner(model, pad_id, cfg, critic=critic)


def build_generator(
    cfg: Config,
    model: Any,
    tokenizer: Any,
    model_path: str,
    task: Any,
    render: PromptRenderer,
    worker_offset: int = 0,
) -> Generator:
    """The rollout backend; a vLLM engine's context is bounded by the longest prompt the run
    keeps + rollout.max_new_tokens (unless vllm.max_model_len is set), and its seed is
    train.seed + `worker_offset` (unless vllm.seed is set)."""
    max_prompt_len = None
    bound = BACKENDS.get(cfg.rollout.backend).context_bound
    if bound is not None and bound(cfg):
        max_prompt_len = longest_prompt_tokens(
            task,
            render,
            tokenizer,
            getattr(model.config, "max_position_embeddings", None),
            cfg.rollout.max_new_tokens,
            seed=cfg.train.seed,
        )
    return make_generator(
        cfg,
        unwrap_model(model),
        tokenizer,
        model_path,
        max_prompt_len=max_prompt_len,
        worker_offset=worker_offset,
    )


def reward_set(cfg: Config, rewards: list[Any] | None = None) -> list[Any]:
    """The run's rewards (`rewards`, or resolved from the config) with, under
    `reward_isolation=process`, their workers' fork server running: build it before the
    model loads (rewards/isolation.py: a worker forked later would hold the model's pages)."""
    if rewards is None:
        rewards = resolve_rewards([(r.name, r.weight) for r in cfg.rewards])
    if cfg.rollout.reward_isolation == "process":
        prepare_isolation(rewards)
    return rewards


def build_producer(
    cfg: Config,
    model: Any,
    tokenizer: Any,
    model_path: str,
    prompt_rng: np.random.Generator,
    log: Log,
    task: Any = None,
    rewards: Any = None,
    generator: Generator | None = None,
    render: PromptRenderer | None = None,
) -> RolloutProducer:
    """Prompts -> generation -> scoring -> rollouts, on this model's weights."""
    if render is None:
        render = PromptRenderer(tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
    if task is None:
        task = task_from_config(cfg.task)
    if generator is None:
        generator = build_generator(cfg, model, tokenizer, model_path, task, render)
    return RolloutProducer(
        cfg,
        task,
        rewards
        if rewards is not None
        else resolve_rewards([(r.name, r.weight) for r in cfg.rewards]),
        tokenizer,
        render,
        generator,
        # a prompt longer than the engine's context is skipped and counted, never sent to it
        getattr(generator, "max_model_len", None)
        or getattr(model.config, "max_position_embeddings", None),
        prompt_rng,
        log,
    )


@dataclass
class Components:
    """What a learner-side run is made of (the synchronous and asynchronous sessions)."""

    cfg: Config
    model: Any
    tokenizer: Any
    model_path: str
    render: PromptRenderer
    task: Any
    learner: Learner
    generator: Generator
    # the generator when its backend owns a copy of the weights (vLLM), which every new
    # policy version is pushed into; None when it generates with the learner's model
    engine: WeightOwner | None
    producer: RolloutProducer
    buffer: Buffer | None  # None until `auto` design resolves N / B
    source: BatchSource | None
    prompt_rng: np.random.Generator
    shuffle_rng: np.random.Generator
    eval_rows: list[dict[str, Any]]
    n_params: int
    max_positions: int | None
    eval_skipped_too_long: int = 0  # held-out prompts that do not fit (not in eval_rows)


def place_policy(
    cfg: Config,
    device: torch.device,
    log: Log,
    ckpt: Path | None = None,
    policy: tuple[Any, Any, str] | None = None,
) -> tuple[Any, Any, str]:
    """The run's policy on `device`: the API's model object (moved only when train.device is
    not auto: it keeps its own device otherwise), else loaded from the config or `ckpt`."""
    if policy is not None and ckpt is None:  # a model object from the Python API
        model, tokenizer, model_path = policy
        if cfg.train.device != "auto":  # e.g. TRL's use_cpu=True; auto: the model's device
            model = model.to(device)
        log(f"policy trains on {model_device(model)} (train.device={cfg.train.device})")
        return model, tokenizer, model_path
    lora = cfg.model.lora.enabled
    # resume: the checkpoint's policy folder (LoRA: its adapter, on the configured base)
    model_cfg = (
        cfg.model.model_copy(update={"path": str(ckpt / "policy")})
        if ckpt and not lora
        else cfg.model
    )
    adapter = ckpt / "policy" if ckpt and lora else None
    with torch.random.fork_rng():  # building a warm start must not shift this run's RNG
        model, tokenizer, model_path = load_policy(
            model_cfg, cfg.task, log=log, adapter=adapter, seed=cfg.train.seed, device=device
        )
    log(f"policy trains on {device} (train.device={cfg.train.device})")
    return model.to(device), tokenizer, model_path  # train.device (auto: cuda if available)


def _generator(
    cfg: Config, engine: bool, model: Any, tokenizer: Any, model_path: str, task: Any, render: Any
) -> tuple[Generator, WeightOwner | None]:
    """(the run's generator, itself again when its backend owns a copy of the weights);
    without an engine in this process (`engine=False`) a weight-owning backend's fallback
    generates with the learner's own model (a LoRA wrapper's layers stay active inside it)."""
    gen_cfg = cfg
    backend = BACKENDS.get(cfg.rollout.backend)
    if not engine and backend.owns_weights:
        fallback = backend.fallback or "hf"
        gen_cfg = cfg.model_copy(
            update={"rollout": cfg.rollout.model_copy(update={"backend": fallback})}
        )
    generator = build_generator(gen_cfg, model, tokenizer, model_path, task, render)
    owns = BACKENDS.get(gen_cfg.rollout.backend).owns_weights
    return generator, cast(WeightOwner, generator) if owns else None


def _eval_rows(
    cfg: Config, task: Any, render: Any, tokenizer: Any, max_positions: int | None, log: Log
) -> tuple[list[dict[str, Any]], int]:
    """The held-out prompts that fit, as training keeps them (not scored as ordinary rows),
    and how many did not (warned about once)."""
    rows, skipped = rows_that_fit(
        held_out_rows(cfg, task), render, tokenizer, max_positions, cfg.rollout.max_new_tokens
    )
    if skipped:
        total = skipped + len(rows)
        note = too_long_note(skipped, total, max_positions, cfg.rollout.max_new_tokens)
        log(f"warning: {note}")
    return rows, skipped


def build_components(
    cfg: Config,
    log: Log = print,
    ckpt: Path | None = None,
    make_main_buffer: Callable[[Config], Buffer] = build_buffer,
    policy: tuple[Any, Any, str] | None = None,
    task: Any = None,
    rewards: list[Any] | None = None,
    engine: bool = True,
) -> Components:
    """Build every part of a run; `ckpt`: load the policy from this checkpoint (resume).

    `engine=False` (a learner whose rollouts come from generator workers): no vLLM engine in
    this process; its evaluations generate with its own policy (the hf backend).

    `policy` (model, tokenizer, model_path), `task` and `rewards` (WeightedReward list): objects
    from the Python API used instead of building them from the config; `policy` only without
    `ckpt` (a resumed run always loads its checkpoint's policy). The API has already prepared a
    given model (models.prepare_policy: pad token, left padding, LoRA, checkpointing).

    The order of construction is part of a run's determinism (the RNG is seeded after the
    warm start and the critic's and buffers' set-up draws from it): keep it.
    """
    lora = cfg.model.lora.enabled
    # first: train.device=cuda on a machine without CUDA fails here, in one line
    device = resolve_device(cfg.train.device)
    # the rewards before the model: their workers' fork server must not hold its pages
    rewards = reward_set(cfg, rewards)
    model, tokenizer, model_path = place_policy(cfg, device, log, ckpt, policy)
    if lora:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"LoRA: training {trainable:,} adapter parameters; the base model stays frozen")
    render = PromptRenderer(tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
    # seed after loading: a run is the same whether or not its warm start was cached
    seed_all(cfg.train.seed)
    if task is None:
        task = task_from_config(cfg.task)
    if getattr(task, "skipped", None):
        log(task.skip_summary())
    buffer = make_main_buffer(cfg) if not cfg.needs_design else None
    learner = build_learner(cfg, model, tokenizer.pad_token_id, model_path)
    generator, weight_owner = _generator(cfg, engine, model, tokenizer, model_path, task, render)
    prompt_rng = np.random.default_rng(cfg.train.seed)
    producer = build_producer(
        cfg, model, tokenizer, model_path, prompt_rng, log, task, rewards, generator, render
    )
    shuffle_rng = np.random.default_rng(cfg.train.seed + 1)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    eval_rows, eval_skipped = _eval_rows(cfg, task, render, tokenizer, max_positions, log)
    return Components(
        cfg=cfg,
        model=model,
        tokenizer=tokenizer,
        model_path=model_path,
        render=render,
        task=task,
        learner=learner,
        generator=generator,
        engine=weight_owner,
        producer=producer,
        buffer=buffer,
        source=build_batch_source(cfg, buffer, producer, learner) if buffer is not None else None,
        prompt_rng=prompt_rng,
        shuffle_rng=shuffle_rng,
        eval_rows=eval_rows,
        n_params=sum(p.numel() for p in model.parameters()),
        max_positions=max_positions,
        eval_skipped_too_long=eval_skipped,
    )
