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
from typing import Any

import numpy as np
import torch

from replayrl.algorithms import ADVANTAGES
from replayrl.config.schema import Config, ConfigError
from replayrl.data.ar3po import Ar3poSource, CorrectResponseStore
from replayrl.data.batch_source import BatchSource, BufferSource, RemixSource
from replayrl.data.buffer import Buffer, make_buffer
from replayrl.data.buffer.groups import ScoredGroupBuffer
from replayrl.data.exgrpo import ExgrpoSource, ExperienceStore
from replayrl.data.group_sources import DynamicSamplingSource, GroupReplaySource
from replayrl.learner.critic import ValueModel
from replayrl.learner.learner import Learner
from replayrl.models.loading import unwrap_model
from replayrl.rollout.evaluation import held_out_rows
from replayrl.rollout.generation import Generator, make_generator
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
    return make_buffer(cfg.buffer.kind, cfg.buffer.capacity, **buffer_kwargs(cfg))  # type: ignore[arg-type]


def build_window(cfg: Config) -> Buffer | None:
    """ReMix's window of the last N_pol policies' rollouts (sampled without removal)."""
    rm = cfg.remix
    if not rm.enabled:
        return None
    return make_buffer(
        "replay",
        rm.num_policies * cfg.rollouts_per_step,
        max_staleness=rm.num_policies,
        seed=cfg.train.seed + 2,
    )


def build_batch_source(
    cfg: Config,
    buffer: Buffer,
    window: Buffer | None,
    producer: RolloutProducer | None = None,
    learner: Learner | None = None,
) -> BatchSource:
    """`producer`: the run's own, for sources that generate more within a step (DAPO's
    dynamic sampling calls it until its batch is full; without one it trains on the first
    call's groups)."""
    gs = cfg.groups
    if gs.source == "dynamic_sampling":
        ds = gs.dynamic_sampling
        return DynamicSamplingSource(
            buffer,
            producer.produce if producer is not None else None,
            ds.train_prompts or cfg.rollout.prompts_per_step,
            cfg.rollout.prompts_per_step,
            cfg.train.epochs,
            ds,
        )
    if gs.source == "group_replay":
        store = ScoredGroupBuffer(gs.group_replay.capacity, seed=cfg.train.seed + 3)
        return GroupReplaySource(buffer, store, cfg.train.epochs, gs.group_replay)
    if gs.source == "ar3po":
        return build_ar3po(cfg, buffer, producer)
    if gs.source == "exgrpo":
        return build_exgrpo_source(cfg, buffer, producer, learner)
    if cfg.remix.enabled:
        check_replay_advantage(cfg)
        return RemixSource(
            buffer,
            window,
            cfg.batch_size,
            cfg.remix,
            budget=cfg.generated_budget,
            prompts_per_step=cfg.rollout.prompts_per_step,
        )
    return BufferSource(buffer, cfg.batch_size, cfg.train.epochs)


def check_replay_advantage(cfg: Config) -> None:
    """remix.replay_advantage against the registered estimator: a group estimator's advantage
    is computed once at generation (stored: a replayed rollout keeps its behaviour group's),
    a critic estimator's is recomputed with the current critic at every step."""
    wanted = cfg.remix.replay_advantage
    critic = ADVANTAGES.get(cfg.algorithm.advantage).needs_critic
    if wanted == "recomputed" and not critic:
        raise ConfigError(
            f"remix.replay_advantage=recomputed with algorithm.advantage="
            f"{cfg.algorithm.advantage}: a group advantage cannot be recomputed against pi_k "
            "(pi_k sampled no group for a replayed prompt); use stored, or a critic (gae)"
        )
    if wanted == "stored" and critic:
        raise ConfigError(
            f"remix.replay_advantage=stored with algorithm.advantage={cfg.algorithm.advantage}: "
            "the critic's advantages are recomputed at every step, none is stored; use "
            "recomputed"
        )


def build_ar3po(cfg: Config, buffer: Buffer, producer: RolloutProducer | None) -> Ar3poSource:
    """AR3PO: rounds of rollout.num_generations responses through the run's producer (again
    for the same prompts), a per-prompt store of correct responses."""
    ar = cfg.groups.ar3po
    return Ar3poSource(
        buffer,
        None if producer is None else (lambda v, s, b, t, k: producer.produce(v, s, b, t, k)),
        CorrectResponseStore(ar.store_per_prompt, ar.store_prompts),
        cfg.rollout.num_generations,
        cfg.rollout.prompts_per_step,
        cfg.train.epochs,
        cfg.algorithm.scale_rewards,
        ar,
    )


def build_exgrpo_source(
    cfg: Config, buffer: Buffer, producer: RolloutProducer | None, learner: Learner | None
) -> ExgrpoSource:
    """ExGRPO (arXiv 2510.02245): the producer generates for stored questions, the learner
    scores trajectories by entropy (without them: no extra calls, random selection)."""
    ex = cfg.groups.exgrpo
    store = ExperienceStore(cfg.rollout.num_generations, ex.store_per_question, ex.store_questions)
    return ExgrpoSource(
        buffer,
        store,
        producer.produce if producer is not None else None,
        (lambda: producer.last_rows) if producer is not None else dict,
        (lambda n: producer.task.sample_train(n, producer.prompt_rng))
        if producer is not None
        else (lambda n: []),
        learner.mean_entropies if learner is not None else None,
        cfg.train.epochs,
        cfg.groups.exgrpo,
        cfg.algorithm.scale_rewards,
        cfg.train.seed + 4,
    )


def build_learner(cfg: Config, model: Any, pad_id: int, model_path: str) -> Learner:
    """The learner, with a critic initialised from the policy when the advantage needs one."""
    critic = (
        ValueModel.from_pretrained(model_path)
        if ADVANTAGES.get(cfg.algorithm.advantage).needs_critic
        else None
    )
    return Learner(model, pad_id, cfg, critic=critic)


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
    return RolloutProducer(
        cfg,
        task if task is not None else task_from_config(cfg.task),
        rewards
        if rewards is not None
        else resolve_rewards([(r.name, r.weight) for r in cfg.rewards]),
        tokenizer,
        render,
        generator or make_generator(cfg, unwrap_model(model), tokenizer, model_path),
        getattr(model.config, "max_position_embeddings", None),
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
    producer: RolloutProducer
    buffer: Buffer | None  # None until `auto` design resolves N / B
    window: Buffer | None
    source: BatchSource | None
    prompt_rng: np.random.Generator
    shuffle_rng: np.random.Generator
    eval_rows: list[dict[str, Any]]
    n_params: int
    max_positions: int | None


def build_components(
    cfg: Config,
    log: Log = print,
    ckpt: Path | None = None,
    make_main_buffer: Callable[[Config], Buffer] = build_buffer,
    policy: tuple[Any, Any, str] | None = None,
    task: Any = None,
    rewards: list[Any] | None = None,
) -> Components:
    """Build every part of a run; `ckpt`: load the policy from this checkpoint (resume).

    `policy` (model, tokenizer, model_path), `task` and `rewards` (WeightedReward list): objects
    from the Python API used instead of building them from the config; `policy` only without
    `ckpt` (a resumed run always loads its checkpoint's policy). The API has already prepared a
    given model (models.prepare_policy: pad token, left padding, LoRA, checkpointing).

    The order of construction is part of a run's determinism (the RNG is seeded after the
    warm start and the critic's and buffers' set-up draws from it): keep it.
    """
    lora = cfg.model.lora.enabled
    # resume: the checkpoint's policy folder (LoRA: its adapter, on the configured base)
    model_cfg = (
        cfg.model.model_copy(update={"path": str(ckpt / "policy")})
        if ckpt and not lora
        else cfg.model
    )
    adapter = ckpt / "policy" if ckpt and lora else None
    # the rewards before the model: their workers' fork server must not hold its pages
    rewards = reward_set(cfg, rewards)
    if policy is not None and ckpt is None:  # a model object from the Python API
        model, tokenizer, model_path = policy
    else:
        with torch.random.fork_rng():  # building a warm start must not shift this run's RNG
            model, tokenizer, model_path = load_policy(
                model_cfg, cfg.task, log=log, adapter=adapter, seed=cfg.train.seed
            )
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
    window = build_window(cfg)
    # the transformers model itself (a LoRA wrapper's layers stay active inside it)
    generator = make_generator(cfg, unwrap_model(model), tokenizer, model_path)
    prompt_rng = np.random.default_rng(cfg.train.seed)
    producer = build_producer(
        cfg, model, tokenizer, model_path, prompt_rng, log, task, rewards, generator, render
    )
    shuffle_rng = np.random.default_rng(cfg.train.seed + 1)
    return Components(
        cfg=cfg,
        model=model,
        tokenizer=tokenizer,
        model_path=model_path,
        render=render,
        task=task,
        learner=learner,
        generator=generator,
        producer=producer,
        buffer=buffer,
        window=window,
        source=build_batch_source(cfg, buffer, window, producer, learner)
        if buffer is not None
        else None,
        prompt_rng=prompt_rng,
        shuffle_rng=shuffle_rng,
        eval_rows=held_out_rows(cfg, task),
        n_params=sum(p.numel() for p in model.parameters()),
        max_positions=getattr(model.config, "max_position_embeddings", None),
    )
