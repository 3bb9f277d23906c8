"""A run's services around its loop: set-up from components, evaluation, the no-signal and
no-training guards, step metrics, checkpoints, resume, and the final summary.

The loops themselves (run/loops/sync.py, run/loops/asynchronous.py) are plain functions over a
session's components (producer, batch source, learner); nothing here generates, decides what
the next batch is or trains.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from replayrl.config.registries import BACKENDS, RUNTIMES
from replayrl.config.schema import Config, config_to_yaml
from replayrl.data.buffer import Buffer
from replayrl.data.rollout_record import Rollout
from replayrl.errors import RunFailed, RunStopped
from replayrl.learner.learner import Learner
from replayrl.methods.buffer import BatchSource
from replayrl.models.device import is_out_of_memory, oom_phase, out_of_memory_message
from replayrl.rollout.evaluation import evaluate_policy
from replayrl.rollout.generation.base import Generator
from replayrl.rollout.producer import Production
from replayrl.run.callbacks import RunHooks
from replayrl.run.completions import CompletionsLog
from replayrl.run.components import Components, build_batch_source, build_buffer, build_components
from replayrl.run.metrics import MetricsLogger, Progress
from replayrl.run.records.ledger import WALL_SECONDS_COVERS, format_accounting
from replayrl.run.records.provenance import run_provenance
from replayrl.run.records.run_record import record_signature
from replayrl.run.signal import RewardSignalMonitor, start_accuracy_warning
from replayrl.run.state import Counters, accounting, declared_counters, summarize
from replayrl.storage.checkpoint import (
    WRITE_ERRORS,
    describe_missing,
    latest_checkpoint,
    load_state,
    save_checkpoint,
    set_rng_state,
)
from replayrl.storage.io import atomic_write_json, atomic_write_text
from replayrl.storage.sharded_checkpoint import SHARDED_DIR, is_sharded_checkpoint, load_sharded

Log = Callable[[str], None]


class WholeLearner:
    """How a session reads its learner for checkpoints, evaluation and resume when one
    process holds the whole policy. Sharded learners plug in their own
    (`distributed.fsdp_learner.ShardedOutputs`): the session asks, never swaps its fields."""

    def restore(self, learner: Learner, ckpt: Path, state: dict[str, Any], log: Log) -> None:
        """The learner's part of a resume. A checkpoint of sharded learners keeps AdamW's
        state (and a frozen reference) as DCP shards: this whole learner loads them all."""
        learner.load_state_dict(state)
        if is_sharded_checkpoint(ckpt):
            log(f"loading the sharded learner state of {ckpt} into one unsharded learner")
            ref, critic = learner.base_model, learner.critic_pass
            load_sharded(
                ckpt / SHARDED_DIR,
                learner.model,
                learner.optimizer,
                restore_rng=False,  # this process's generators come from the state file
                reference=ref if isinstance(ref, torch.nn.Module) else None,
                critic=(critic.critic, critic.optimizer) if critic is not None else None,
            )

    def learner_state(self, learner: Learner) -> dict[str, Any]:
        """The learner's part of a checkpoint's state file."""
        return learner.state_dict()

    def shard_writer(self) -> Callable[[Path], None] | None:
        """What writes the learner's shards into a checkpoint's temp folder; None: the state
        file holds the whole learner."""
        return None

    def policy_to_save(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy a checkpoint's HF folder is written from."""
        return model

    def eval_generator(self, generator: Generator, learner: Learner) -> Generator:
        """The generator an evaluation samples with."""
        return generator


class Session:
    """One run: its components, counters, metrics log and checkpoints."""

    # this process generates the rollouts it trains on (a vLLM engine here if configured);
    # False for learners fed by generator workers (run/loops/asynchronous.py)
    builds_engine = True

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        log: Log = print,
        resume: bool = False,
        hooks: RunHooks | None = None,
        outputs: WholeLearner | None = None,
    ):
        """`hooks`: objects and callbacks from the Python API (sync runs only). `outputs`:
        how checkpoints, evaluation and resume read the learner (default: whole)."""
        self.cfg, self.run_dir, self.log = cfg, run_dir, log
        self.outputs = outputs if outputs is not None else WholeLearner()
        self.hooks = hooks if hooks is not None else RunHooks()
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        # resume: the newest complete checkpoint (newer, damaged ones are logged and skipped)
        ckpt = latest_checkpoint(run_dir, log=log) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(describe_missing(run_dir))
        h = self.hooks
        self.parts: Components = build_components(
            cfg,
            log,
            ckpt,
            self.make_buffer,
            policy=h.policy,
            task=h.task,
            rewards=h.rewards,
            engine=self.builds_engine,
        )
        p = self.parts
        self.model, self.tokenizer, self.model_path = p.model, p.tokenizer, p.model_path
        self.learner, self.generator, self.producer = p.learner, p.generator, p.producer
        self.engine = p.engine  # the generator when it owns weights of its own (vLLM)
        self.task, self.eval_rows, self.render = p.task, p.eval_rows, p.render
        self.n_params, self.max_positions = p.n_params, p.max_positions
        self.source: BatchSource | None = p.source
        log(f"precision: {self.learner.precision_choice.describe()}")  # `auto` resolved
        self.counters = Counters(declared=declared_counters(cfg))
        self.failed_steps = 0  # steps in a row that trained nothing (check_training)
        self._generated_at_last_step = 0  # eval.every_rollouts' grid (set again by start)
        # no silent non-learning: steps whose groups all have equal rewards (signal.py)
        self.reward_signal = RewardSignalMonitor(patience=cfg.logging.no_signal_patience)
        if ckpt is not None:
            self._restore(ckpt)
        self.metrics = MetricsLogger.from_config(  # JSONL, TensorBoard, W&B as configured
            run_dir, cfg, resume_step=self.counters.step if resume else None, log=log
        )
        lg = cfg.logging  # what the model wrote, every few steps (run/completions.py)
        self.completions = CompletionsLog(
            run_dir,
            lg.completions,
            lg.completions_every,
            table=self.metrics.table,
            printer=log if lg.progress else None,
            resume_step=self.counters.step if resume else None,
        )

    def make_buffer(self, cfg: Config) -> Buffer:
        """The run's main buffer (the asynchronous sessions add a staleness bound)."""
        return build_buffer(cfg)

    @property
    def buffer(self) -> Buffer:
        assert self.source is not None, "the buffer is built once `auto` design has run"
        return self.source.buffer

    def adopt_design(self, cfg: Config, warmup: list[Rollout], design: dict[str, Any]) -> None:
        """Continue with the `auto`-resolved config: its buffer, holding the warm-up rollouts."""
        self.cfg = self.learner.cfg = self.producer.cfg = cfg
        self.counters.design = design
        atomic_write_text(self.run_dir / "config.yaml", config_to_yaml(cfg))  # resume uses it
        self.source = build_batch_source(cfg, self.make_buffer(cfg))
        self.source.buffer.push(warmup)

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        assert self.source is not None
        return {
            "learner": self.outputs.learner_state(self.learner),
            **self.source.state_dict(),  # "buffer" (and ReMix's "window")
            "prompt_rng": self.parts.prompt_rng.bit_generator.state,
            "shuffle_rng": self.parts.shuffle_rng.bit_generator.state,
            "counters": self.counters.state_dict(),
            "reward_signal": self.reward_signal.state_dict(),
        }

    def _restore(self, ckpt: Path) -> dict[str, Any]:
        """Load a checkpoint into this session; returns its state (runtimes read their own
        parts of it)."""
        state = load_state(ckpt)
        self.outputs.restore(self.learner, ckpt, state["learner"], self.log)
        assert self.source is not None
        self.source.load_state_dict(state)  # a ReMix source reads a missing window as None
        self.parts.prompt_rng.bit_generator.state = state["prompt_rng"]
        self.parts.shuffle_rng.bit_generator.state = state["shuffle_rng"]
        self.counters = Counters.from_state(state["counters"], self.counters.declared)
        if "reward_signal" in state:  # a checkpoint without it: the monitor starts afresh
            self.reward_signal.load_state_dict(state["reward_signal"])
        set_rng_state(state["rng"])
        self.log(
            f"resumed from {ckpt} at step {self.counters.step}, version {self.learner.version}"
        )
        return state

    def checkpoint(self) -> Path:
        path = save_checkpoint(
            self.run_dir,
            self.counters.step,
            self.outputs.policy_to_save(self.model),
            self.tokenizer,
            self._state(),
            keep_last=self.cfg.checkpoint.keep_last,
            config=self.cfg.model_dump(mode="json"),  # resume checks against this record
            record_signature=record_signature(self.run_dir),  # the signed run record's
            extra=self.outputs.shard_writer(),
        )
        self.hooks.checkpointed(self.counters.step, path)
        return path

    # -- evaluation and the no-signal monitor ---------------------------------------------------
    def watch_signal(self, fresh: list[Rollout], stats: dict[str, float], step: int) -> None:
        """Feed the no-signal monitor one step's FRESH rollouts (never replayed ones): its
        metrics go into `stats`, its warning (after `no_signal_patience` such steps) to the log."""
        report = self.reward_signal.update((r.group_id, r.reward) for r in fresh)
        stats.update(report.metrics)
        if report.warning:
            self.log(f"WARNING at step {step}: {report.warning}")

    def account(self, p: Production) -> None:
        self.counters.account(p)

    def evaluate(self) -> dict[str, float]:
        gen = self.outputs.eval_generator(self.generator, self.learner)
        return evaluate_policy(self.cfg, gen, self.task, self.eval_rows, self.render)

    def timed_eval(self) -> dict[str, float]:
        c = self.counters
        if not self.eval_rows:  # nothing held out (task.eval_size=0, no eval file): no eval
            return {}
        t0 = time.perf_counter()
        ev = self.evaluate()
        c.eval_seconds += time.perf_counter() - t0
        c.record_eval(ev, self.n_params)
        self.hooks.evaluated(c.step, ev)
        return ev

    # -- guards -------------------------------------------------------------------------------
    def check_training(self, batch: list[Rollout], m: dict[str, float], step: int) -> None:
        """No silent non-training: `train.failure_patience` steps in a row whose updates were
        all skipped (non-finite gradient) or whose gradient was exactly 0 although the batch
        had non-zero advantages end the run with RunFailed naming the cause."""
        k = self.cfg.train.failure_patience
        if not k or not m:
            return
        cause = None
        if m.get("skipped_updates", 0.0) >= 1.0:
            cause = (
                "every update was skipped because the gradient was not finite (NaN/inf): "
                "damaged policy weights, rewards too large for the training dtype, or "
                f"train.lr={self.cfg.train.lr:g} too high"
            )
        elif m.get("grad_norm") == 0.0 and _advantages_nonzero(batch, m):
            cause = (
                "the gradient was exactly 0 although the batch's advantages were not: the "
                "policy is saturated or its weights are wrecked (train.lr="
                f"{self.cfg.train.lr:g} too high?)"
            )
        self.failed_steps = self.failed_steps + 1 if cause else 0
        if cause and self.failed_steps >= k:
            raise RunFailed(
                f"nothing was trained for {self.failed_steps} steps in a row (up to step "
                f"{step}): {cause}"
            )

    def check_trained(self) -> None:
        """No silent non-training, whatever the run's length: a run shorter than
        `train.failure_patience` whose every rollout was dropped would otherwise end with exit
        0 and a final model that is the starting one. RunFailed names the cause, after a
        checkpoint (the state is kept, and the error names it); no final model or summary is
        written."""
        c = self.counters
        if c.step == 0 or c.rollouts_trained or c.tokens_trained:
            return
        self.checkpoint()
        dropped = c.rollouts_dropped_reward_error + c.rollouts_dropped_no_reward
        if not c.rollouts_generated:
            cause = (
                f"every prompt was longer than the model's {self.max_positions} positions "
                f"minus rollout.max_new_tokens={self.cfg.rollout.max_new_tokens}"
                if c.prompts_skipped_too_long
                else "no rollout was generated"
            )
        elif dropped < c.rollouts_generated:  # some were kept: the batch source took none
            cause = "no rollout reached a training batch (the batch source filtered them all)"
        elif c.first_reward_error:  # every one dropped, some by a failing reward function
            cause = f"every rollout was dropped: {c.first_reward_error}"
        else:
            cause = "all reward functions returned None for every completion (no reward)"
        raise RunFailed(
            f"nothing was trained in {c.step} step(s), so no final model was written: {cause}"
        )

    # -- around the loop ---------------------------------------------------------------------
    def start(self) -> None:
        """Log the replay design and evaluate the starting policy (not on resume)."""
        cfg, c = self.cfg, self.counters
        self._generated_at_last_step = c.rollouts_generated  # eval.every_rollouts' grid
        R, B = cfg.rollouts_per_step, cfg.batch_size
        if cfg.method_spec.buffer == "replay" and cfg.buffer.capacity:
            self.log(
                f"replay: staleness horizon x = N/R = {cfg.buffer.capacity / R:.3g}, "  # type: ignore[operator]
                f"replay ratio y = B/R = {B / R:.3g}"
            )
        if c.step == 0 and not c.evals and self.eval_rows:
            first = self.timed_eval()
            self.metrics.log(0, first)
            self.log(
                f"initial eval accuracy {first['eval/accuracy']:.3f} "
                f"on {len(self.eval_rows)} prompts"
            )
            warning = start_accuracy_warning(
                first["eval/accuracy"],
                len(self.eval_rows),
                # no model.path and not a model object ("<in-memory model>"): the tiny model
                tiny_model=not cfg.model.path and not self.model_path.startswith("<"),
                max_new_tokens=cfg.rollout.max_new_tokens,
                completions_file=str(self.completions.path) if cfg.logging.completions else None,
            )
            if warning:
                self.log(f"WARNING: {warning}")

    def end_step(self, stats: dict[str, float], progress: Progress) -> None:
        """Common step metrics, periodic eval and checkpoint, progress bar."""
        cfg, c = self.cfg, self.counters
        stats.update(
            {
                "buffer/size": float(len(self.buffer)),
                "rollouts_generated": float(c.rollouts_generated),
                "tokens_generated": float(c.tokens_generated),
                "tokens_trained": float(c.tokens_trained),
                "flops/estimated": c.flops(self.n_params),
                "policy_version": float(self.learner.version),
                "prompts_skipped_too_long": float(c.prompts_skipped_too_long),
            }
        )
        if self.eval_due() or c.step == cfg.train.steps:
            stats.update(self.timed_eval())
        stats["wall_seconds"] = c.wall_seconds
        self.metrics.log(c.step, stats)
        self.hooks.step_end(c.step, stats)  # a callback may ask the loop to stop
        progress.update(
            reward=stats.get("reward/mean", float("nan")),
            acc=c.evals[-1]["eval/accuracy"] if c.evals else float("nan"),
            ent=stats.get("train/entropy", float("nan")),
        )
        ck = cfg.checkpoint.every
        if ck and c.step % ck == 0 and c.step != cfg.train.steps:
            self.checkpoint()

    @contextmanager
    def out_of_memory_as_failure(self) -> Iterator[None]:
        """A CUDA out-of-memory error in a step becomes RunFailed: one line naming the knobs
        that lower memory and the last good checkpoint, not a torch traceback."""
        try:
            yield
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            ckpt = latest_checkpoint(self.run_dir)
            backend = BACKENDS.get(self.cfg.rollout.backend)
            where = oom_phase(exc, backend.frames)
            last = str(ckpt) if ckpt else None
            raise RunFailed(out_of_memory_message(where, last, backend.memory_knobs)) from None

    def eval_due(self) -> bool:
        """After this step: every eval.every steps, or (eval.every_rollouts = K) when the
        generated rollouts crossed a multiple of K during the step."""
        c, k = self.counters, self.cfg.eval.every_rollouts
        before = self._generated_at_last_step
        self._generated_at_last_step = c.rollouts_generated
        if k is not None:
            return c.rollouts_generated // k > before // k
        every = self.cfg.eval.every
        return bool(every) and c.step % every == 0

    def interrupted(self, progress: Progress, signum: int = signal.SIGINT) -> None:
        """Checkpoint between steps (exactly an uninterrupted run's state) and stop; raises
        RunStopped(signum), which the CLI turns into exit code 128 + signum."""
        progress.close()
        path = self.checkpoint()
        self.metrics.close()
        self.log(
            f"interrupted at step {self.counters.step} ({signal_name(signum)}): checkpoint "
            f"written to {path}; resume with --resume {self.run_dir}"
        )
        raise RunStopped(signum)

    def finish(self) -> dict[str, Any]:
        """Final eval (unless the last step had one), checkpoint, summary, accounting; a run
        that took steps but trained on nothing fails instead (check_trained)."""
        self.check_trained()
        c = self.counters
        last_eval_step = c.evals[-1]["step"] if c.evals else -1
        if last_eval_step != c.step and self.eval_rows:
            self.metrics.log(c.step, self.timed_eval())
        self.write_final(self.checkpoint())
        summary = self.summary()
        atomic_write_json(self.run_dir / "summary.json", summary)
        self.metrics.close()
        self.report_accounting(summary)
        return summary

    def write_final(self, ckpt: Path) -> None:
        """runs/NAME/final: the last policy as a plain model folder (LoRA merged). A base
        model that cannot be loaded again (an in-memory one) leaves the checkpoint only."""
        from replayrl.models.export import write_final

        try:
            path = write_final(ckpt / "policy", self.run_dir, self.cfg.model.dtype)
        except (ValueError, *WRITE_ERRORS) as exc:  # a full disk: safetensors' error too
            self.log(f"final model folder not written ({exc}); the policy is in {ckpt}/policy")
            return
        self.log(f"final model: {path}")

    def report_accounting(self, summary: dict[str, Any]) -> None:
        acc = summary["accounting"]
        # mu / gamma matter where generators run beside learners, or where `auto` used mu
        lockstep = RUNTIMES.get(self.cfg.runtime).lockstep
        show_mu = not lockstep or bool(self.counters.design)
        self.log(format_accounting(acc["ledger"], acc, show_mu=show_mu))

    def buffers(self) -> list[Any]:
        return self.source.buffers() if self.source is not None else []

    def accounting(self) -> dict[str, Any]:
        return accounting(self.cfg, self.counters, self.buffers())

    def summary(self) -> dict[str, Any]:
        summary = summarize(
            self.cfg,
            self.counters,
            self.buffers(),
            policy_version=self.learner.version,
            num_eval_prompts=len(self.eval_rows),
            run_dir=self.run_dir,
            num_parameters=self.n_params,
            model_path=self.model_path,
        )
        summary["wall_seconds_covers"] = WALL_SECONDS_COVERS
        summary["no_signal_steps"] = self.reward_signal.total
        # held-out prompts too long to evaluate: skipped and counted, as in training
        summary["eval_prompts_skipped_too_long"] = self.parts.eval_skipped_too_long
        summary["precision"] = self.learner.precision_choice.as_dict()
        summary["provenance"] = run_provenance(
            self.model_path, self.cfg.train.threads, summary["precision"]
        )
        return summary


def _advantages_nonzero(batch: list[Rollout], m: dict[str, float]) -> bool:
    """Did the loss see a non-zero advantage? The learner's `advantage_abs_max` covers GAE's
    per-token advantages (PPO), where each rollout's own `advantage` field stays 0."""
    if "advantage_abs_max" in m:
        return m["advantage_abs_max"] > 1e-6
    return any(abs(r.advantage) > 1e-6 for r in batch)


# what a scheduler sends before it kills a job: SLURM and Kubernetes SIGTERM, a closed
# terminal or ssh session SIGHUP; each is handled like Ctrl-C (exit 128 + signal number)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def abort_now(signum: int) -> None:
    """A second stop signal: end the process at once, 128 + `signum`, with one line.

    Not an exception: a signal handler runs wherever the main thread is, and an exception
    raised inside a finalizer (`__del__`, a weakref callback: a reward worker's or a
    checkpoint's cleanup) is printed as a raw "Exception ignored ... RunStopped" traceback
    and swallowed, so the run went on. Nothing is lost by not unwinding: checkpoints are
    renamed into place only once complete (a half-written one is removed at the next
    resume), the run folder's lock is a kernel flock released with the process, and reward
    workers, async-local generators and a local Ray instance end with their parent."""
    print(
        f"\ninterrupted ({signal_name(signum)} again): stopped at once, without a checkpoint; "
        "--resume continues from the newest complete one",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(128 + signum)


class StopOnSignal:
    """The first SIGINT / SIGTERM / SIGHUP asks the loop to stop after the current step (it
    then checkpoints, even with `checkpoint.every=0`); a second one aborts at once
    (`abort`, default `abort_now`: the process ends with 128 + the signal's number)."""

    def __init__(self, abort: Callable[[int], None] = abort_now) -> None:
        self.requested = False
        self.signum: int = signal.SIGINT
        self._previous: dict[int, Any] = {}
        self._abort = abort

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            self._abort(signum)
            return
        self.requested, self.signum = True, signum
        name = signal_name(signum)
        print(f"\n{name}: stopping after this step (send it again to abort now)", flush=True)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


class InterruptOnSignal:
    """Outside the loop (loading, the first eval, the final summary): SIGTERM and SIGHUP
    raise `RunStopped` as SIGINT raises KeyboardInterrupt, so the cleanup that Ctrl-C runs
    (putting back a replaced run, releasing the run folder's lock) runs for them too."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    @staticmethod
    def _raise(signum: int, frame: object) -> None:
        raise RunStopped(signum)

    def __enter__(self) -> InterruptOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS[1:]:
                self._previous[sig] = signal.signal(sig, self._raise)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


def reflection_rate(texts: list[str], words: list[str]) -> float:
    """Share of completions with a self-reflection word ("wait", "check", ...; paper 2)."""
    if not texts or not words:
        return math.nan
    lowered = [w.lower() for w in words]
    return sum(any(w in t.lower() for w in lowered) for t in texts) / len(texts)
