"""The synchronous loop: generate R rollouts -> score -> advantages -> push -> sample B -> update.

Producer (generator + scorer) -> buffer -> consumer (learner) in every mode: the on-policy
baseline is a buffer that hands out the freshest rollouts and removes them, so replay and
ReMix only change the buffer and the loss, never this loop.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replayrl.accounting import (
    RoleClock,
    format_accounting,
    ledger_stats,
    role_summary,
    rollout_ledger,
)
from replayrl.buffer import batch_stats, make_buffer
from replayrl.checkpoint import latest_checkpoint, load_state, save_checkpoint, set_rng_state
from replayrl.config import Config, ConfigError, config_to_yaml, load_config
from replayrl.evaluation import evaluate
from replayrl.generation import make_generator
from replayrl.learner import Learner, ValueModel
from replayrl.metrics import MetricsLogger, Progress
from replayrl.models import load_policy, unwrap_model
from replayrl.producer import Production, RolloutProducer
from replayrl.prompts import PromptRenderer
from replayrl.rewards import resolve_rewards
from replayrl.rollout import Rollout
from replayrl.tasks import task_from_config

Log = Callable[[str], None]


@dataclass
class Counters:
    """Cumulative accounting, saved in checkpoints so resumed runs keep counting."""

    step: int = 0
    rollouts_generated: int = 0
    tokens_generated: int = 0  # completion tokens sampled
    tokens_trained: int = 0  # completion tokens in training batches, counted per update pass
    rollouts_dropped_reward_error: int = 0
    prompts_skipped_too_long: int = 0
    generation_seconds: float = 0.0
    training_seconds: float = 0.0
    wall_seconds: float = 0.0  # training-loop time (generation, scoring, updates), no evals
    eval_seconds: float = 0.0
    mu_per_step: list[float] = field(default_factory=list)
    design: dict[str, float] | None = None  # resolved `auto` buffer design
    reincarnation_step: int | None = None
    evals: list[dict[str, float]] = field(default_factory=list)
    first_reward_error: str | None = None
    rollouts_trained: int = 0  # rollouts in training batches, counted per update pass
    rollouts_sampled: int = 0  # rollouts drawn from the buffer (async replay-ratio pacing)
    rollouts_lost_worker_died: int = 0  # async: the batch a killed generator was producing
    rollouts_discarded: int = 0  # ReMix's window contents dropped at reincarnation
    retired_buffer_stats: list[dict[str, float]] = field(default_factory=list)
    roles: dict[str, dict[str, float]] = field(default_factory=dict)  # async role clocks


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _prepare_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.logging.run_dir) / cfg.logging.name
    if run_dir.exists() and any(run_dir.iterdir()):
        if not cfg.logging.overwrite:
            raise ConfigError(
                f"run folder {run_dir} already exists: resume it with `--resume {run_dir}`, "
                f"pick another logging.name, or set logging.overwrite=true"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class Trainer:
    """Wires task, rewards, generator, buffer, learner, evaluation, logging, checkpoints."""

    def __init__(self, cfg: Config, run_dir: Path, log: Log = print, resume: bool = False):
        self.cfg = cfg
        self.run_dir = run_dir
        self.log = log
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        ckpt = latest_checkpoint(run_dir) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(f"no complete checkpoint under {run_dir}/checkpoints to resume")
        lora = cfg.model.lora.enabled
        # resume: the checkpoint's policy folder (LoRA: its adapter, on the configured base)
        model_cfg = (
            cfg.model.model_copy(update={"path": str(ckpt / "policy")})
            if ckpt and not lora
            else cfg.model
        )
        adapter = ckpt / "policy" if ckpt and lora else None
        with torch.random.fork_rng():  # building a warm start must not shift this run's RNG
            self.model, self.tokenizer, self.model_path = load_policy(
                model_cfg, cfg.task, log=log, adapter=adapter, seed=cfg.train.seed
            )
        if lora:
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            log(f"LoRA: training {trainable:,} adapter parameters; the base model stays frozen")
        self.render = PromptRenderer(self.tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
        # seed after loading: a run is the same whether or not its warm start was cached
        _seed_all(cfg.train.seed)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.task = task_from_config(cfg.task)
        if getattr(self.task, "skipped", None):
            log(self.task.skip_summary())  # type: ignore[attr-defined]
        self.rewards = resolve_rewards([(r.name, r.weight) for r in cfg.rewards])
        self.buffer = self._make_buffer() if not cfg.needs_design else None
        critic = (
            ValueModel.from_pretrained(self.model_path)
            if cfg.algorithm.advantage == "gae"
            else None
        )
        self.learner = Learner(self.model, self.tokenizer.pad_token_id, cfg, critic=critic)
        rm = cfg.remix
        # ReMix's window of the last N_pol policies' rollouts (sampled without removal)
        self.window = (
            make_buffer(
                "replay",
                rm.num_policies * cfg.rollouts_per_step,
                max_staleness=rm.num_policies,
                seed=cfg.train.seed + 2,
            )
            if rm.enabled
            else None
        )
        # the transformers model itself (a LoRA wrapper's layers stay active inside it)
        self.generator = make_generator(
            cfg, unwrap_model(self.model), self.tokenizer, self.model_path
        )
        self.prompt_rng = np.random.default_rng(cfg.train.seed)
        self.producer = RolloutProducer(
            cfg,
            self.task,
            self.rewards,
            self.tokenizer,
            self.render,
            self.generator,
            self.max_positions,
            self.prompt_rng,
            log,
        )
        self.shuffle_rng = np.random.default_rng(cfg.train.seed + 1)
        self.counters = Counters()
        eval_rows = self.task.eval_rows()
        self.eval_rows = eval_rows[: cfg.eval.num_prompts] if cfg.eval.num_prompts else eval_rows
        if ckpt is not None:
            self._restore(ckpt)
        self.metrics = MetricsLogger(
            run_dir, cfg.logging.tensorboard, resume_step=self.counters.step if resume else None
        )

    def _buffer_kwargs(self) -> dict[str, Any]:
        """`make_buffer` keyword arguments from the config (shared with Ray's buffer actors)."""
        b = self.cfg.buffer
        return dict(
            sampler=b.sampler,
            delta=b.delta,
            with_replacement=b.with_replacement,
            num_shards=b.num_shards,
            max_staleness=b.max_staleness,
            seed=self.cfg.train.seed,
        )

    def _make_buffer(self):
        return make_buffer(self.cfg.buffer.kind, self.cfg.buffer.capacity, **self._buffer_kwargs())

    def _auto_design(self) -> None:
        """Resolve `auto` N / B: measure mu on warm-up batches, then apply paper 1's optimum.

        The warm-up rollouts are real (version 0) and go into the buffer; the training
        passes used for timing take no optimizer step.
        """
        from replayrl.design import design

        cfg, R = self.cfg, self.cfg.rollouts_per_step
        mus, produced = [], []
        for _ in range(cfg.design.warmup_steps):
            t0 = time.perf_counter()
            rollouts, _ = self.produce()
            t_gen = time.perf_counter() - t0
            produced.extend(rollouts)
            if not rollouts:
                continue
            t1 = time.perf_counter()
            self.learner.measure_backward(rollouts)
            t_train = time.perf_counter() - t1
            mus.append((t_gen / len(rollouts)) / (t_train / len(rollouts)))
            self.counters.generation_seconds += t_gen
        if not mus:
            raise ValueError("auto design: every warm-up rollout was dropped; cannot measure mu")
        mu = statistics.median(mus)
        d = cfg.design
        rep = design(mu, d.alpha, d.rho, rollouts_per_step=R)
        if cfg.buffer.capacity == "auto":
            cfg.buffer.capacity = rep.N
        if cfg.train.batch_size == "auto":
            cfg.train.batch_size = rep.B
        if cfg.batch_size > cfg.buffer.capacity and not cfg.buffer.with_replacement:
            cfg.buffer.with_replacement = True  # the theory's sampling model when B > N
        self.counters.design = {
            "mu": mu,
            "x_star": rep.x_star,
            "y_star": rep.y_star,
            "N": cfg.buffer.capacity,
            "B": cfg.batch_size,
        }
        self.log(
            f"auto design: measured mu = {mu:.3g} -> x* = {rep.x_star:.3g}, y* = {rep.y_star:.3g}"
            f" -> buffer.capacity N = {cfg.buffer.capacity}, train.batch_size B = "
            f"{cfg.batch_size} (R = {R})"
        )
        (self.run_dir / "config.yaml").write_text(config_to_yaml(cfg))  # resume uses these
        self.buffer = self._make_buffer()
        self.buffer.push(produced)

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "buffer": self.buffer.state_dict(),
            "window": self.window.state_dict() if self.window is not None else None,
            "prompt_rng": self.prompt_rng.bit_generator.state,
            "shuffle_rng": self.shuffle_rng.bit_generator.state,
            "counters": self.counters.__dict__.copy(),
        }

    def _restore(self, ckpt: Path) -> None:
        state = load_state(ckpt)
        self.learner.load_state_dict(state["learner"])
        self.buffer.load_state_dict(state["buffer"])
        if state.get("window") is None:
            self.window = None  # after reincarnation
        elif self.window is not None:
            self.window.load_state_dict(state["window"])
        self.prompt_rng.bit_generator.state = state["prompt_rng"]
        self.shuffle_rng.bit_generator.state = state["shuffle_rng"]
        self.counters = Counters(**state["counters"])
        set_rng_state(state["rng"])
        self.log(
            f"resumed from {ckpt} at step {self.counters.step}, version {self.learner.version}"
        )

    def checkpoint(self) -> Path:
        return save_checkpoint(
            self.run_dir,
            self.counters.step,
            self.model,
            self.tokenizer,
            self._state(),
            keep_last=self.cfg.checkpoint.keep_last,
        )

    # -- one step ----------------------------------------------------------------------------
    def produce(self) -> tuple[list[Rollout], dict[str, float]]:
        """Generate, score and turn samples into rollouts with group advantages."""
        c = self.counters
        p = self.producer.produce(self.learner.version, c.step, c.step * 1_000_000)
        self.account(p)
        return p.rollouts, {
            **p.stats,
            "rollouts/dropped_reward_error": float(c.rollouts_dropped_reward_error),
        }

    def account(self, p: Production) -> None:
        """Add one generation batch to the run's counters (the rollout ledger's inputs)."""
        c = self.counters
        c.rollouts_generated += p.generated
        c.tokens_generated += p.tokens
        c.rollouts_dropped_reward_error += p.dropped_reward_error
        c.prompts_skipped_too_long += p.skipped_too_long
        if p.first_error and c.first_reward_error is None:
            c.first_reward_error = p.first_error

    def evaluate(self) -> dict[str, float]:
        e = self.cfg.eval
        return evaluate(
            self.generator,
            self.task,
            self.eval_rows,
            self.cfg.rollout.max_new_tokens,
            pass_k=e.pass_k,
            temperature=e.temperature,
            render=self.render,
        )

    def _record_eval(self, metrics: dict[str, float]) -> None:
        c = self.counters
        c.evals.append(
            {
                "step": c.step,
                "rollouts_generated": c.rollouts_generated,
                "tokens_generated": c.tokens_generated,
                "tokens_trained": c.tokens_trained,
                "flops": self._flops(),
                "wall_seconds": c.wall_seconds,
                "generation_seconds": c.generation_seconds,
                "training_seconds": c.training_seconds,
                **metrics,
            }
        )

    def _flops(self) -> float:
        """Estimated compute: 2 N per generated token + 6 N per trained token (design.md)."""
        c = self.counters
        return 2.0 * self.n_params * c.tokens_generated + 6.0 * self.n_params * c.tokens_trained

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, c = self.cfg, self.counters
        if self.buffer is None:
            self._auto_design()
        R, B = cfg.rollouts_per_step, cfg.batch_size
        self._start()
        progress = Progress(cfg.train.steps, c.step, cfg.logging.progress)
        with _StopOnSigint() as stop:
            while c.step < cfg.train.steps:
                self._one_step(R, B, progress)
                if stop.requested:
                    # between steps: the checkpoint is exactly an uninterrupted run's state
                    self._interrupted(progress)
        progress.close()
        return self._finish()

    def _start(self) -> None:
        """Log the replay design and evaluate the starting policy (not on resume)."""
        cfg, c = self.cfg, self.counters
        R, B = cfg.rollouts_per_step, cfg.batch_size
        if cfg.buffer.kind == "replay" and cfg.buffer.capacity:
            self.log(
                f"replay: staleness horizon x = N/R = {cfg.buffer.capacity / R:.3g}, "
                f"replay ratio y = B/R = {B / R:.3g}"
            )
        if c.step == 0 and not c.evals:
            first = self._timed_eval()
            self.metrics.log(0, first)
            self.log(
                f"initial eval accuracy {first['eval/accuracy']:.3f} "
                f"on {len(self.eval_rows)} prompts"
            )

    def _timed_eval(self) -> dict[str, float]:
        c = self.counters
        t0 = time.perf_counter()
        ev = self.evaluate()
        c.eval_seconds += time.perf_counter() - t0
        self._record_eval(ev)
        return ev

    def _interrupted(self, progress: Progress) -> None:
        progress.close()
        path = self.checkpoint()
        self.metrics.close()
        self.log(
            f"interrupted at step {self.counters.step}: checkpoint written to {path}; "
            f"resume with --resume {self.run_dir}"
        )
        raise KeyboardInterrupt

    def _finish(self) -> dict[str, Any]:
        """Final eval (unless the last step had one), checkpoint, summary, accounting."""
        c = self.counters
        last_eval_step = c.evals[-1]["step"] if c.evals else -1
        if last_eval_step != c.step:
            self.metrics.log(c.step, self._timed_eval())
        self.checkpoint()
        summary = self.summary()
        _write_json(self.run_dir / "summary.json", summary)
        self.metrics.close()
        self.report_accounting(summary)
        return summary

    def report_accounting(self, summary: dict[str, Any]) -> None:
        acc = summary["accounting"]
        self.log(format_accounting(acc["ledger"], acc))

    def _one_step(self, R: int, B: int, progress: Progress) -> None:
        cfg, c = self.cfg, self.counters
        version = self.learner.version
        rm = cfg.remix
        remix_active = rm.enabled and (
            rm.reincarnation_step is None or c.step < rm.reincarnation_step
        )
        if rm.enabled and c.step == rm.reincarnation_step and c.reincarnation_step is None:
            self.learner.reincarnate()
            self._retire(self.window)
            self.window = None  # from now on plain on-policy training
            c.reincarnation_step = c.step
            self.log(f"policy reincarnation at step {c.step}: pi_base <- pi_{c.step}, p = 0")
        t_start = time.perf_counter()
        rollouts, stats = self.produce()
        t_gen = time.perf_counter() - t_start
        if remix_active:
            # Mix-PPG: a share p of the batch from the last N_pol policies, 1-p fresh
            p = rm.off_policy_fraction
            n_stale = round(p / (1 - p) * len(rollouts))
            stale_part = self.window.sample(n_stale, current_version=version) if n_stale else []
            self.window.push(rollouts)
            batch = rollouts + stale_part
            epochs = rm.utd
        else:
            self.buffer.push(rollouts)
            batch = self.buffer.sample(B, current_version=version)
            epochs = rm.utd_after if rm.enabled else cfg.train.epochs
        t_train = self._train_batch(batch, epochs, rollouts, stats)
        c.generation_seconds += t_gen
        if batch and rollouts:
            mu = (t_gen / len(rollouts)) / (t_train / (len(batch) * epochs))
            c.mu_per_step.append(mu)
        stats["time/generation_s"] = t_gen
        c.wall_seconds += time.perf_counter() - t_start
        self._end_step(stats, progress)

    def _train_batch(
        self, batch: list[Rollout], epochs: int, fresh: list[Rollout], stats: dict[str, float]
    ) -> float:
        """One learner step on `batch` (`fresh`: this step's new rollouts, for text metrics)."""
        cfg, c = self.cfg, self.counters
        version = self.learner.version
        t1 = time.perf_counter()
        if batch:
            stats.update({f"batch/{k}": v for k, v in batch_stats(batch, version).items()})
            train_metrics = self.learner.train_step(
                batch,
                self.shuffle_rng,
                step=c.step + 1,  # t in the paper's lambda(t): 1-based update count
                epochs=epochs,
                stale=[r.policy_version < version for r in batch],
                policy_frozen=c.step < cfg.critic.warmup_steps and self.learner.critic is not None,
            )
            stats.update({f"train/{k}": v for k, v in train_metrics.items()})
            stats["reflection_rate"] = _reflection_rate(
                [r.completion_text for r in fresh], cfg.logging.reflection_words
            )
        else:
            self.learner.version += 1  # nothing to learn from (all dropped): still a new step
        t_train = time.perf_counter() - t1
        c.tokens_trained += sum(r.completion_ids.numel() for r in batch) * epochs
        c.rollouts_trained += len(batch) * epochs
        c.training_seconds += t_train
        c.step += 1
        stats["time/training_s"] = t_train
        if hasattr(self.generator, "load_weights"):  # an engine with its own copy (vLLM)
            self.generator.load_weights(
                unwrap_model(self.model).named_parameters(), self.learner.version
            )
        return t_train

    def _end_step(self, stats: dict[str, float], progress: Progress) -> None:
        """Common step metrics, periodic eval and checkpoint, progress bar."""
        cfg, c = self.cfg, self.counters
        stats.update(
            {
                "buffer/size": float(len(self.buffer)),
                "rollouts_generated": float(c.rollouts_generated),
                "tokens_generated": float(c.tokens_generated),
                "tokens_trained": float(c.tokens_trained),
                "flops/estimated": self._flops(),
                "policy_version": float(self.learner.version),
                "prompts_skipped_too_long": float(c.prompts_skipped_too_long),
            }
        )
        every = cfg.eval.every
        if (every and c.step % every == 0) or c.step == cfg.train.steps:
            stats.update(self._timed_eval())
        stats["wall_seconds"] = c.wall_seconds
        self.metrics.log(c.step, stats)
        progress.update(
            reward=stats.get("reward/mean", float("nan")),
            acc=c.evals[-1]["eval/accuracy"] if c.evals else float("nan"),
            ent=stats.get("train/entropy", float("nan")),
        )
        ck = cfg.checkpoint.every
        if ck and c.step % ck == 0 and c.step != cfg.train.steps:
            self.checkpoint()

    def _retire(self, buffer: Any) -> None:
        """Keep a dropped buffer's counters in the ledger; its contents count as discarded."""
        c = self.counters
        st = ledger_stats(buffer)
        c.rollouts_discarded += int(st["size"])
        c.retired_buffer_stats.append({**st, "size": 0.0})

    def buffers(self) -> list[Any]:
        return [b for b in (self.buffer, self.window) if b is not None]

    def ledger(self) -> dict[str, Any]:
        c = self.counters
        return rollout_ledger(
            c.rollouts_generated,
            c.rollouts_dropped_reward_error,
            c.rollouts_lost_worker_died,
            [*(ledger_stats(b) for b in self.buffers()), *c.retired_buffer_stats],
            c.rollouts_discarded,
        )

    def role_clocks(self) -> dict[str, dict[str, float]]:
        """Sync: each role waits while the other works (async runtimes measure their own)."""
        c = self.counters
        if c.roles:
            return c.roles
        gen, learn = RoleClock(), RoleClock()
        gen.busy_s, gen.idle_s = c.generation_seconds, c.training_seconds
        gen.rollouts, gen.tokens, gen.batches = c.rollouts_generated, c.tokens_generated, c.step
        learn.busy_s, learn.idle_s = c.training_seconds, c.generation_seconds
        learn.rollouts, learn.tokens, learn.batches = c.rollouts_trained, c.tokens_trained, c.step
        return {"generator/0": gen.as_dict(), "learner/0": learn.as_dict()}

    def accounting(self) -> dict[str, Any]:
        workers = self.cfg.workers.generators if self.cfg.runtime != "sync" else 1
        trainers = self.cfg.workers.learners if self.cfg.runtime != "sync" else 1
        return {"ledger": self.ledger(), **role_summary(self.role_clocks(), workers, trainers)}

    def summary(self) -> dict[str, Any]:
        c = self.counters
        accs = [e["eval/accuracy"] for e in c.evals]
        mu = statistics.median(c.mu_per_step) if c.mu_per_step else None
        return {
            "initial_eval_accuracy": accs[0] if accs else None,
            "final_eval_accuracy": accs[-1] if accs else None,
            "best_eval_accuracy": max(accs) if accs else None,
            "steps": c.step,
            "policy_version": self.learner.version,
            "rollouts_generated": c.rollouts_generated,
            "tokens_generated": c.tokens_generated,
            "tokens_trained": c.tokens_trained,
            "rollouts_dropped_reward_error": c.rollouts_dropped_reward_error,
            "first_reward_error": c.first_reward_error,
            "prompts_skipped_too_long": c.prompts_skipped_too_long,
            "wall_seconds": c.wall_seconds,
            "generation_seconds": c.generation_seconds,
            "training_seconds": c.training_seconds,
            "eval_seconds": c.eval_seconds,
            "mu_median": mu,
            "design": c.design,
            "reincarnation_step": c.reincarnation_step,
            "num_eval_prompts": len(self.eval_rows),
            "run_dir": str(self.run_dir),
            "num_parameters": self.n_params,
            "model_path": self.model_path,
            "runtime": self.cfg.runtime,
            "accounting": self.accounting(),
            "evals": c.evals,
        }


class _StopOnSigint:
    """First Ctrl-C asks the loop to stop after the current step; a second one aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstopping after this step (Ctrl-C again to abort now)", flush=True)

    def __enter__(self) -> _StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _reflection_rate(texts: list[str], words: list[str]) -> float:
    """Share of completions with a self-reflection word ("wait", "check", ...; paper 2)."""
    if not texts or not words:
        return math.nan
    lowered = [w.lower() for w in words]
    return sum(any(w in t.lower() for w in lowered) for t in texts) / len(texts)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-save "Writing model shards" bars drown the loop's


def train(cfg: Config, log: Log = print) -> dict[str, Any]:
    """Start a new run from a resolved config."""
    _quiet_transformers()
    run_dir = _prepare_run_dir(cfg)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    try:
        trainer = _trainer_class(cfg)(cfg, run_dir, log=log)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # a failed start must not block a rerun
        raise
    return trainer.run()


def resume(
    run_dir: str | Path, overrides: list[str] | None = None, log: Log = print
) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (config from the run folder + overrides)."""
    _quiet_transformers()
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    cfg = load_config(cfg_path, overrides)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    return _trainer_class(cfg)(cfg, run_dir, log=log, resume=True).run()


def _trainer_class(cfg: Config) -> type[Trainer]:
    """sync: this module's loop; async-local: generator processes; ray: see distributed."""
    if cfg.runtime == "async-local":
        from replayrl.distributed.async_trainer import AsyncTrainer

        return AsyncTrainer
    if cfg.runtime == "ray":
        from replayrl.distributed.ray_runtime import RayDriver

        return RayDriver  # type: ignore[return-value]
    return Trainer
