"""TRL peer: the same on-policy GRPO run trained by TRL's `GRPOTrainer`, logged in our format.

Same warm start (`load_policy`), same task rows (the prompts our runner would draw, in the
same order), same reward functions and scoring (`replayrl.rollout.rewards.score`), same evaluation
(`replayrl.rollout.evaluation.evaluate` with an `HFGenerator` over the trainer's live model, prompts
rendered by our `PromptRenderer`), and
TRL settings chosen so that one optimizer step consumes exactly one generation batch of
`prompts_per_step x num_generations` rollouts, each used once:

* TRL 1.16 batch semantics (one process): `per_device_train_batch_size` counts rollouts per
  micro-batch, `generation_batch_size = per_device_train_batch_size * steps_per_generation`
  rollouts are generated at once, and an optimizer step takes `gradient_accumulation_steps`
  micro-batches. We set per_device = a divisor of R = P * G no larger than
  `train.micro_batch_size` (memory only, like our micro-batches), gradient_accumulation_steps
  = steps_per_generation = R / per_device, num_iterations = 1, so generation batch = one
  optimizer step = R rollouts.
* `loss_type="dapo"` for `loss_agg=token_mean`: TRL divides the summed token losses by
  `num_items_in_batch`, the active completion tokens of the whole generation batch (rescaled to
  one accumulation window, which here *is* the generation batch), i.e. sum over all tokens /
  total tokens of the batch, exactly our token_mean. ("bnpo" divides by the tokens of each
  micro-batch, which equals it only without gradient accumulation.) `loss_agg=seq_mean` maps to
  `loss_type="grpo"` (mean over sequences of each sequence's token mean).
* The optimizer is ours, passed in: `torch.optim.AdamW(lr, weight_decay)` over all parameters
  with a constant LambdaLR (the HF Trainer's own AdamW would exempt biases and norms from
  weight decay).

`wall_seconds` is training time only: the sum over optimizer steps of the time from the step's
start (before generation) to its end (after the optimizer step), excluding evaluation,
metrics logging and set-up. Anything that could not be matched exactly is listed in
`summary["unmatched_settings"]`.

Prompts: TRL renders a conversational prompt with the tokenizer's chat template (generation
prompt added) and passes plain text through, so each training row's prompt is handed over as
our renderer's input would become the same text: messages with `task.system_prompt` first
when a chat template is used, else the already rendered plain text. Reward functions still
get what our runner gives them: the row's own prompt and the completion as text (or as one
assistant message for a conversational prompt), found through a row-index column.
Not matched: TRL tokenizes a plain-text prompt with the tokenizer's special tokens (a BOS,
where the tokenizer adds one; our generator adds none), and with a tokenizer that defines a
response schema TRL parses conversational completions before the rewards see them.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from replayrl.config.method_sections import DEFAULT_METHOD
from replayrl.config.schema import Config, config_to_yaml, config_value, load_config
from replayrl.design.theory import cost_ratio, estimate_mu
from replayrl.rollout.evaluation import evaluate_policy, held_out_rows
from replayrl.rollout.generation import HFGenerator
from replayrl.rollout.producer import completion_for_reward
from replayrl.rollout.prompts import PromptRenderer, render_plain, to_messages
from replayrl.rollout.rewards import resolve_rewards, score
from replayrl.rollout.rewards.math import completion_text
from replayrl.rollout.tasks import task_from_config
from replayrl.run.metrics import MetricsLogger, Progress
from replayrl.run.policy import load_policy
from replayrl.run.records.folder import new_run_folder
from replayrl.run.records.provenance import run_provenance
from replayrl.storage.io import atomic_write_json, quiet_transformers

Log = Callable[[str], None]

INSTALL_HINT = "pip install 'replayrl[bench]'"
REWARD_NAME = "replayrl_reward"  # the single combined reward function TRL sees
# the configuration TRL's GRPOTrainer is the counterpart of: key -> (value, why)
MIRRORED = {
    "method.name": (DEFAULT_METHOD, "TRL GRPO is on-policy, each rollout trained on once"),
    "algorithm.loss_type": ("grpo_clip", "only grpo_clip"),
    "algorithm.advantage": ("grpo", "TRL GRPO's is the group-relative one"),
}

# TRL log keys -> our metric names (anything else is kept as `trl/<key>`)
_TRL_TO_OURS = {
    "reward": "reward/mean",
    "entropy": "train/entropy",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/lr",
    "clip_ratio/region_mean": "train/clip_frac",
    "kl": "train/kl_to_base",
    "completions/mean_length": "completion_length",
    "completions/clipped_ratio": "truncated_frac",
}
_PASSTHROUGH_PREFIXES = ("train/", "reward/")  # logged by our reward wrapper via `log_metric`


def _import_trl():
    try:
        import trl
    except ImportError as exc:
        raise ImportError(
            f"the TRL peer needs the `trl` package (and `datasets`): {INSTALL_HINT}"
        ) from exc
    return trl


def _check_supported(cfg: Config) -> None:
    """The peer mirrors on-policy GRPO only; anything structurally different is an error."""
    R = cfg.rollouts_per_step
    problems = []
    for key, (value, why) in MIRRORED.items():
        if config_value(cfg, key) != value:
            problems.append(f"{key}={config_value(cfg, key)} ({why})")
    if cfg.train.epochs != 1:
        problems.append(f"train.epochs={cfg.train.epochs} (each rollout is used once)")
    if cfg.train.batch_size not in (None, R):
        problems.append(f"train.batch_size={cfg.train.batch_size} (must be R = {R})")
    if cfg.train.mini_batch_size not in (None, R):
        problems.append(f"train.mini_batch_size={cfg.train.mini_batch_size} (one update per step)")
    if cfg.kl.beta > 0 and (cfg.kl.target != "reference" or cfg.kl.estimator != "k3"):
        problems.append(
            f"kl.target={cfg.kl.target}, kl.estimator={cfg.kl.estimator} with kl.beta > 0 "
            "(TRL has only the k3 KL to the initial policy)"
        )
    if cfg.rollout.num_generations < 2:
        problems.append("rollout.num_generations < 2 (TRL GRPO needs at least 2)")
    if problems:
        raise ValueError(
            "the TRL peer runs on-policy GRPO only; unsupported: " + "; ".join(problems)
        )


def _micro_batch(rollouts: int, micro: int) -> int:
    """Largest divisor of `rollouts` that is at most `micro` (micro-batches must tile R)."""
    return max(d for d in range(1, min(rollouts, micro) + 1) if rollouts % d == 0)


def trl_grpo_settings(cfg: Config) -> tuple[dict[str, Any], list[str]]:
    """`GRPOConfig` keyword arguments mirroring `cfg`, and what could not be matched exactly."""
    _check_supported(cfg)
    r, a, t = cfg.rollout, cfg.algorithm, cfg.train
    R = cfg.rollouts_per_step
    micro = _micro_batch(R, t.micro_batch_size)
    accum = R // micro
    kwargs: dict[str, Any] = {
        # batch geometry: one generation batch of R rollouts per optimizer step, used once
        "max_steps": t.steps,
        "num_generations": r.num_generations,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "steps_per_generation": accum,
        "num_iterations": 1,
        "shuffle_dataset": False,  # rows are already the prompts our runner draws, in order
        # optimisation (the optimizer itself is passed in: AdamW over all params, constant lr)
        "learning_rate": t.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": t.weight_decay,
        "optim": "adamw_torch",
        "max_grad_norm": t.max_grad_norm or 0.0,  # 0 = no clipping, like our None
        # loss
        "loss_type": {"token_mean": "dapo", "seq_mean": "grpo"}.get(a.loss_agg, a.loss_agg),
        "epsilon": a.epsilon,
        "epsilon_high": a.epsilon_high if a.epsilon_high is not None else a.epsilon,
        "delta": None,
        "importance_sampling_level": "token",
        "scale_rewards": "group" if a.scale_rewards else "none",
        "multi_objective_aggregation": "sum_then_normalize",
        "beta": cfg.kl.beta,
        "entropy_coef": a.entropy_coef,
        "top_entropy_quantile": 1.0,
        "mask_truncated_completions": False,
        # sampling
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "max_completion_length": r.max_new_tokens,
        # machine and bookkeeping
        "use_vllm": False,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "activation_checkpointing": False,  # TRL defaults gradient checkpointing on
        "seed": t.seed,
        "data_seed": t.seed,
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_strategy": "steps",
        "logging_steps": 1,
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "log_completions": False,
    }
    return kwargs, _unmatched(cfg)


def _unmatched(cfg: Config) -> list[str]:
    """What `trl_grpo_settings` could not match exactly, in words."""
    r, a, R = cfg.rollout, cfg.algorithm, cfg.rollouts_per_step
    unmatched = [
        "advantage normalisation: TRL divides by (group std + 1e-4), replayrl by "
        "(group std + 1e-6)",
        "importance ratio: with one pass per generation batch TRL takes the training forward's "
        "own log-probs as the old policy (ratio exactly 1); replayrl uses the log-probs recorded "
        "during generation (ratio 1 up to the numerical gap between cached generation and the "
        "training forward)",
        "reward failures: a rollout whose reward function fails gets advantage 0 in TRL but its "
        "tokens stay in the loss normaliser; replayrl drops the rollout",
        "non-finite gradient norm: replayrl skips the optimizer step, the HF Trainer applies it",
    ]
    if R > r.decode_batch_size:
        unmatched.append(
            f"generation chunking: TRL generates all R = {R} rollouts in one `generate` call; "
            f"replayrl in chunks of rollout.decode_batch_size = {r.decode_batch_size}"
        )
    if a.entropy_coef > 0 and a.loss_agg != "token_mean":
        unmatched.append(
            "entropy bonus: TRL's is always a token mean; replayrl aggregates it with "
            f"algorithm.loss_agg = {a.loss_agg}"
        )
    return unmatched


def _param_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def _update_norm(model: torch.nn.Module, initial: dict[str, torch.Tensor]) -> float:
    total = 0.0
    for n, p in model.named_parameters():
        total += float((p.detach().cpu().float() - initial[n].float()).pow(2).sum())
    return math.sqrt(total)


class _Recorder(TrainerCallback):
    """Our evaluation, accounting and metrics, driven by the HF Trainer's callbacks."""

    def __init__(
        self,
        cfg: Config,
        task,
        eval_rows: list[dict[str, Any]],
        tokenizer,
        metrics: MetricsLogger,
        n_params: int,
        log: Log,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.eval_rows = eval_rows
        self.tokenizer = tokenizer
        self.render = PromptRenderer(tokenizer, cfg.task.chat_template, cfg.task.system_prompt)
        # the training rows as the task gave them (`trl_prompts` rewrites the prompts TRL sees)
        self.train_rows: list[dict[str, Any]] | None = None
        self.metrics = metrics
        self.n_params = n_params
        self.log = log
        self.rewards = resolve_rewards([(x.name, x.weight) for x in cfg.rewards])
        self.progress: Progress | None = None
        self.initial_params: dict[str, torch.Tensor] | None = None
        self.step = 0
        self.rollouts_generated = 0
        self.tokens_generated = 0
        self.rollouts_dropped = 0
        self.first_reward_error: str | None = None
        self.wall_seconds = 0.0
        self.generation_seconds = 0.0
        self.training_seconds = 0.0
        self.eval_seconds = 0.0
        self.mu_per_step: list[float] = []
        self.evals: list[dict[str, Any]] = []
        self.trl_final: dict[str, Any] = {}
        self._t_step: float | None = None
        self._gen_in_step = 0.0
        self._pending: tuple[int, dict[str, Any]] | None = None

    # -- hooks called from the trainer's internals --------------------------------------------
    def reward_function(self, columns: list[str]) -> Callable[..., list[float | None]]:
        """One TRL reward function running our weighted, error-isolating `score`."""

        def replayrl_reward(prompts, completions, completion_ids=None, log_metric=None, **kw):
            # TRL hands conversational prompts' completions over as messages
            texts = [completion_text(c) for c in completions]
            if ROW_COLUMN in kw and self.train_rows is not None:
                rows = [self.train_rows[int(i)] for i in kw[ROW_COLUMN]]
            else:  # rows given to TRL as they are
                rows = [
                    {"prompt": p, **{c: kw[c][i] for c in columns if c != ROW_COLUMN}}
                    for i, p in enumerate(prompts)
                ]
            # what our runner's rewards receive: the row's prompt, the completion in its form
            pairs = zip(texts, rows, strict=True)
            completions = [completion_for_reward(t, r["prompt"]) for t, r in pairs]
            result = score(self.rewards, [r["prompt"] for r in rows], completions, rows)
            if result.first_error and self.first_reward_error is None:
                self.first_reward_error = result.first_error
                self.log(f"warning: {result.first_error} (those rollouts get no advantage)")
            self.rollouts_dropped += result.errors
            self.rollouts_generated += len(completions)
            if completion_ids is not None:
                self.tokens_generated += sum(len(ids) for ids in completion_ids)
            if log_metric is not None:
                correct = [self.task.is_correct(t, r) for t, r in zip(texts, rows, strict=True)]
                log_metric("train/accuracy", sum(correct) / max(len(correct), 1))
                for name, value in result.means().items():
                    log_metric(f"reward/{name}", value)
            return result.rewards

        replayrl_reward.__name__ = REWARD_NAME
        return replayrl_reward

    def time_generation(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._gen_in_step += time.perf_counter() - t0

        return timed

    # -- evaluation ---------------------------------------------------------------------------
    def _flops(self) -> float:
        # each generated token is trained on exactly once
        return 8.0 * self.n_params * self.tokens_generated

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        t0 = time.perf_counter()
        generator = HFGenerator(
            model,
            self.tokenizer,
            self.cfg.rollout.decode_batch_size,
            impl=self.cfg.rollout.generation_impl,
        )
        ev = evaluate_policy(self.cfg, generator, self.task, self.eval_rows, self.render)
        self.eval_seconds += time.perf_counter() - t0
        self.evals.append(
            {
                "step": self.step,
                "rollouts_generated": self.rollouts_generated,
                "tokens_generated": self.tokens_generated,
                "tokens_trained": self.tokens_generated,
                "flops": self._flops(),
                "wall_seconds": self.wall_seconds,
                "generation_seconds": self.generation_seconds,
                "training_seconds": self.training_seconds,
                "eval_seconds": self.eval_seconds,
                **ev,
            }
        )
        return ev

    # -- TrainerCallback ----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.initial_params = _param_snapshot(model)
        first = self.evaluate(model)
        self.metrics.log(0, {**first, "rollouts_generated": 0.0, "wall_seconds": 0.0})
        self.log(
            f"initial eval accuracy {first['eval/accuracy']:.3f} on {len(self.eval_rows)} prompts"
        )
        self.progress = Progress(self.cfg.train.steps, 0, self.cfg.logging.progress)

    def on_step_begin(self, args, state, control, **kwargs):
        self._t_step = time.perf_counter()
        self._gen_in_step = 0.0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        assert self._t_step is not None
        t_step = time.perf_counter() - self._t_step
        t_gen = self._gen_in_step
        t_train = t_step - t_gen
        self.wall_seconds += t_step
        self.generation_seconds += t_gen
        self.training_seconds += t_train
        # each rollout is trained once (equal counts); a step without generation (TRL reuses
        # one generation for several steps) measures nothing
        mu = cost_ratio(t_gen, 1, t_train, 1) if t_gen > 0 else None
        if mu is not None:
            self.mu_per_step.append(mu)
        self.step = state.global_step
        stats: dict[str, Any] = {
            "rollouts_generated": float(self.rollouts_generated),
            "tokens_generated": float(self.tokens_generated),
            "tokens_trained": float(self.tokens_generated),
            "flops/estimated": self._flops(),
            "time/generation_s": t_gen,
            "time/training_s": t_train,
            "policy_version": float(self.step),
            "rollouts/dropped_reward_error": float(self.rollouts_dropped),
            "wall_seconds": self.wall_seconds,
        }
        every = self.cfg.eval.every
        if (every and self.step % every == 0) or self.step == self.cfg.train.steps:
            stats.update(self.evaluate(model))
        self._pending = (self.step, stats)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_runtime" in logs or self._pending is None:
            self.trl_final.update(logs)  # TRL's end-of-training summary
            return
        step, stats = self._pending
        for key, value in logs.items():
            if key in _TRL_TO_OURS:
                stats[_TRL_TO_OURS[key]] = value
            elif key.startswith(_PASSTHROUGH_PREFIXES):
                stats[key] = value
            elif isinstance(value, (int, float)) or value is None:
                stats[f"trl/{key}"] = value  # TRL's own metric, no replayrl counterpart
        self._flush(step, stats)

    def _flush(self, step: int, stats: dict[str, Any]) -> None:
        self._pending = None
        self.metrics.log(step, stats)
        if self.progress is not None:
            self.progress.update(
                reward=stats.get("reward/mean", float("nan")),
                acc=self.evals[-1]["eval/accuracy"] if self.evals else float("nan"),
                ent=stats.get("train/entropy", float("nan")),
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:  # a step whose log never came
            self._flush(*self._pending)
        if self.progress is not None:
            self.progress.close()


def run_trl_grpo(cfg: Config, run_dir: Path, log: Log = print) -> dict[str, Any]:
    """Train `cfg`'s warm start with TRL's GRPOTrainer; write metrics.jsonl and summary.json.

    Returns the summary (the keys of `replayrl.run.session.Session.summary()` where meaningful, plus
    "peer", "trl_version", "unmatched_settings", "trl_settings", "eval_seconds",
    "total_seconds" and "param_update_norm").
    """
    trl = _import_trl()
    settings, unmatched = trl_grpo_settings(cfg)
    quiet_transformers()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    with torch.random.fork_rng():  # building a warm start must not shift this run's RNG
        model, tokenizer, model_path = load_policy(cfg.model, cfg.task, log=log)
    n_params = sum(p.numel() for p in model.parameters())
    task = task_from_config(cfg.task)  # every task kind and knob (reasoning: op, terms, ...)
    eval_rows = held_out_rows(cfg, task)
    metrics = MetricsLogger.from_config(run_dir, cfg)
    recorder = _Recorder(cfg, task, eval_rows, tokenizer, metrics, n_params, log)
    recorder.train_rows = _train_rows(cfg, task)
    rows = trl_prompts(recorder.train_rows, recorder.render)
    t_start = time.perf_counter()
    try:
        if cfg.train.steps == 0:  # HF reads max_steps=0 as "use num_train_epochs"
            recorder.on_train_begin(None, None, None, model=model)
            recorder.on_train_end(None, None, None)
        else:
            trainer = _make_trainer(cfg, model, tokenizer, rows, recorder, run_dir / "trl")
            with warnings.catch_warnings():  # TRL 1.16 calls a name transformers 5 deprecates
                warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
                trainer.train()
            out = Path(trainer.args.output_dir)
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()  # nothing saved (save_strategy="no")
    finally:
        metrics.close()
    total_seconds = time.perf_counter() - t_start
    accs = [e["eval/accuracy"] for e in recorder.evals]
    assert recorder.initial_params is not None
    summary = {
        "peer": "trl",
        "trl_version": trl.__version__,
        "initial_eval_accuracy": accs[0] if accs else None,
        "final_eval_accuracy": accs[-1] if accs else None,
        "best_eval_accuracy": max(accs) if accs else None,
        "steps": recorder.step,
        "policy_version": recorder.step,
        "rollouts_generated": recorder.rollouts_generated,
        "tokens_generated": recorder.tokens_generated,
        "tokens_trained": recorder.tokens_generated,
        "rollouts_dropped_reward_error": recorder.rollouts_dropped,
        "first_reward_error": recorder.first_reward_error,
        "prompts_skipped_too_long": 0,
        "wall_seconds": recorder.wall_seconds,
        "generation_seconds": recorder.generation_seconds,
        "training_seconds": recorder.training_seconds,
        "eval_seconds": recorder.eval_seconds,
        "total_seconds": total_seconds,
        "mu_median": estimate_mu(recorder.mu_per_step),
        "num_eval_prompts": len(eval_rows),
        "run_dir": str(run_dir),
        "num_parameters": n_params,
        "model_path": model_path,
        "param_update_norm": _update_norm(model, recorder.initial_params),
        "unmatched_settings": unmatched,
        "trl_settings": settings,
        "trl_final_log": recorder.trl_final,
        "evals": recorder.evals,
        "provenance": run_provenance(model_path, cfg.train.threads, None),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    return summary


def _train_rows(cfg: Config, task) -> list[dict[str, Any]]:
    """The prompts our runner draws: sample_train(P, rng) per step == sample_train(steps * P)."""
    n = max(cfg.train.steps, 1) * cfg.rollout.prompts_per_step
    return task.sample_train(n, np.random.default_rng(cfg.train.seed))


# the column of TRL's dataset holding each row's index in the peer's training rows
ROW_COLUMN = "replayrl_row"


def trl_prompts(rows: list[dict[str, Any]], render: PromptRenderer) -> list[dict[str, Any]]:
    """`rows` with each prompt in the form TRL turns into the text our runner generates from:
    messages (system prompt first) when the chat template is used, TRL applying it as
    `render` does; otherwise our plain rendering as a string, which TRL passes through. Each
    row also gets its index (`ROW_COLUMN`) so that rewards can see the original row."""
    out = []
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        if render.uses_template:
            prompt = to_messages(prompt, render.system_prompt)
        else:
            prompt = render_plain(prompt, render.system_prompt)
        out.append({**row, "prompt": prompt, ROW_COLUMN: i})
    return out


def _make_trainer(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict[str, Any]],
    recorder: _Recorder,
    output_dir: Path,
    callbacks: tuple[TrainerCallback, ...] = (),
):
    """A GRPOTrainer with our optimizer, reward scoring, recorder and generation timing."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    settings, _ = trl_grpo_settings(cfg)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    columns = [k for k in rows[0] if k != "prompt"]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[recorder.reward_function(columns)],
        args=GRPOConfig(output_dir=str(output_dir), **settings),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[recorder, *callbacks],
        optimizers=(optimizer, scheduler),
    )
    _drop_console_callbacks(trainer)
    trainer._generate_and_score_completions = recorder.time_generation(
        trainer._generate_and_score_completions
    )
    return trainer


def _drop_console_callbacks(trainer) -> None:
    """Our progress bar and metrics replace the HF Trainer's per-step printing."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """`python -m replayrl.bench.peers.trl_grpo --config grpo [key=value ...]`.

    The run folder is logging.run_dir / logging.name (default name: `<name>-trl`).
    """
    p = argparse.ArgumentParser(prog="python -m replayrl.bench.peers.trl_grpo", description=__doc__)
    p.add_argument("--config", default=None, help="YAML preset (default: built-in defaults)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ns = p.parse_args(argv)
    cfg = load_config(ns.config, ns.overrides)
    if not any(o.startswith("logging.name=") for o in ns.overrides):
        cfg.logging.name = f"{cfg.logging.name}-trl"
    run_dir = Path(cfg.logging.run_dir) / cfg.logging.name
    # an overwritten run comes back if this one fails
    with new_run_folder(run_dir, cfg.logging.overwrite):
        summary = run_trl_grpo(cfg, run_dir)
    print(
        f"TRL peer: final eval accuracy {summary['final_eval_accuracy']:.3f} after "
        f"{summary['steps']} steps, {summary['rollouts_generated']} rollouts, "
        f"{summary['wall_seconds']:.1f}s training wall time -> {run_dir}"
    )
    return summary


if __name__ == "__main__":
    main()
