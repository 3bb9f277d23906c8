"""A run's state outside the loop: counters (saved in checkpoints), the eval record, and the
end-of-run summary and accounting computed from them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from replayrl.config.registries import RUNTIMES
from replayrl.config.schema import Config
from replayrl.design.theory import estimate_mu
from replayrl.records.ledger import (
    RoleClock,
    ledger_stats,
    role_summary,
    rollout_ledger,
    source_terms,
)


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
    reward_seconds: float = 0.0  # in reward functions (sync: excluded from generation_seconds)
    rollouts_dropped_reward_timeout: int = 0  # of rollouts_dropped_reward_error
    mu_per_step: list[float] = field(default_factory=list)
    design: dict[str, Any] | None = None  # resolved `auto` buffer design
    reincarnation_step: int | None = None
    evals: list[dict[str, float]] = field(default_factory=list)
    first_reward_error: str | None = None
    rollouts_trained: int = 0  # rollouts in training batches, counted per update pass
    rollouts_sampled: int = 0  # rollouts drawn from the buffer (async replay-ratio pacing)
    rollouts_lost_worker_died: int = 0  # async: the batch a killed generator was producing
    rollouts_discarded: int = 0  # ReMix's window contents dropped at reincarnation
    retired_buffer_stats: list[dict[str, float]] = field(default_factory=list)
    # group sources (data/sources/): generated and scored, never trained on
    rollouts_filtered_no_signal: int = 0  # groups without reward variance dropped / replaced
    rollouts_filtered_surplus: int = 0  # groups beyond a full dynamic-sampling batch
    # `auto` design's alpha / rho probe: batches of the policies it undoes (recipes/probe.py)
    rollouts_discarded_probe: int = 0
    rollouts_reused: int = 0  # replayed (not fresh) rollouts in training batches, per pass
    generation_rounds: int = 0  # generation calls beyond each step's first (dynamic sampling)
    short_steps: int = 0  # dynamic-sampling steps that hit max_rounds before a full batch
    roles: dict[str, dict[str, float]] = field(default_factory=dict)  # async role clocks
    # a plugin source's counters (`BatchSourceSpec.metrics`) that are not fields above
    extra: dict[str, int] = field(default_factory=dict)

    def count(self, name: str) -> int:
        """A counter a batch source declares (`BatchSourceSpec.metrics` / `.ledger`)."""
        if name in _FIELDS:
            return getattr(self, name)
        return self.extra.get(name, 0)

    def add(self, name: str, n: int) -> None:
        """Add `n` to a source's counter: a field above, or a plugin's own in `extra`."""
        if name in _FIELDS:
            setattr(self, name, getattr(self, name) + n)
        else:
            self.extra[name] = self.extra.get(name, 0) + n

    def account(self, p: Any) -> None:
        """Add one generation batch (a `Production`) to the counters (the ledger's inputs)."""
        self.rollouts_generated += p.generated
        self.tokens_generated += p.tokens
        self.rollouts_dropped_reward_error += p.dropped_reward_error
        self.rollouts_dropped_reward_timeout += p.dropped_reward_timeout
        self.reward_seconds += p.reward_seconds
        self.prompts_skipped_too_long += p.skipped_too_long
        if p.first_error and self.first_reward_error is None:
            self.first_reward_error = p.first_error

    def add_trained(self, batch_tokens: int, batch_size: int, epochs: int, seconds: float) -> None:
        """One learner step: `epochs` passes over a batch, counted per pass."""
        self.tokens_trained += batch_tokens * epochs
        self.rollouts_trained += batch_size * epochs
        self.training_seconds += seconds
        self.step += 1

    def retire(self, buffer: Any) -> None:
        """Keep a dropped buffer's counters in the ledger; its contents count as discarded."""
        st = ledger_stats(buffer)
        self.rollouts_discarded += int(st["size"])
        self.retired_buffer_stats.append({**st, "size": 0.0})

    def flops(self, n_params: int) -> float:
        """Estimated compute: 2 N per generated token + 6 N per trained token (Kaplan et al.)."""
        return 2.0 * n_params * self.tokens_generated + 6.0 * n_params * self.tokens_trained

    def record_eval(self, metrics: dict[str, float], n_params: int) -> None:
        self.evals.append(
            {
                "step": self.step,
                "rollouts_generated": self.rollouts_generated,
                "tokens_generated": self.tokens_generated,
                "tokens_trained": self.tokens_trained,
                # trained rollouts (repeats and epochs counted): bench/targets.py's modelled compute
                "rollouts_trained": self.rollouts_trained,
                "flops": self.flops(n_params),
                "wall_seconds": self.wall_seconds,
                "generation_seconds": self.generation_seconds,
                "training_seconds": self.training_seconds,
                **metrics,
            }
        )


_FIELDS = frozenset(f.name for f in fields(Counters)) - {"extra"}


def ledger(c: Counters, buffers: list[Any]) -> dict[str, Any]:
    return rollout_ledger(
        c.rollouts_generated,
        c.rollouts_dropped_reward_error,
        c.rollouts_lost_worker_died,
        [*(ledger_stats(b) for b in buffers), *c.retired_buffer_stats],
        c.rollouts_discarded,
        discarded_probe=c.rollouts_discarded_probe,
        filtered={term: c.count(counter) for counter, term, _ in source_terms()},
    )


def role_clocks(c: Counters) -> dict[str, dict[str, float]]:
    """Sync: each role waits while the other works (async runtimes measure their own)."""
    if c.roles:
        return c.roles
    gen, learn = RoleClock(), RoleClock()
    gen.busy_s, gen.idle_s = c.generation_seconds, c.training_seconds
    gen.rollouts, gen.tokens, gen.batches = c.rollouts_generated, c.tokens_generated, c.step
    learn.busy_s, learn.idle_s = c.training_seconds, c.generation_seconds
    learn.rollouts, learn.tokens, learn.batches = c.rollouts_trained, c.tokens_trained, c.step
    return {"generator/0": gen.as_dict(), "learner/0": learn.as_dict()}


def accounting(cfg: Config, c: Counters, buffers: list[Any]) -> dict[str, Any]:
    lockstep = RUNTIMES.get(cfg.runtime).lockstep
    workers = 1 if lockstep else cfg.workers.generators
    trainers = 1 if lockstep else cfg.workers.learners
    return {"ledger": ledger(c, buffers), **role_summary(role_clocks(c), workers, trainers)}


def summarize(cfg: Config, c: Counters, buffers: list[Any], **run: Any) -> dict[str, Any]:
    """The run's summary.json; `run` adds policy_version, run_dir, num_eval_prompts,
    num_parameters, model_path (in that order in the file)."""
    accs = [e["eval/accuracy"] for e in c.evals]
    return {
        "initial_eval_accuracy": accs[0] if accs else None,
        "final_eval_accuracy": accs[-1] if accs else None,
        "best_eval_accuracy": max(accs) if accs else None,
        "steps": c.step,
        "policy_version": run["policy_version"],
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
        "reward_seconds": c.reward_seconds,
        "rollouts_dropped_reward_timeout": c.rollouts_dropped_reward_timeout,
        "rollouts_reused": c.rollouts_reused,
        "generation_rounds_extra": c.generation_rounds,
        "short_steps": c.short_steps,
        **c.extra,  # a plugin source's own counters
        "mu_median": estimate_mu(c.mu_per_step),
        "design": c.design,
        "reincarnation_step": c.reincarnation_step,
        "num_eval_prompts": run["num_eval_prompts"],
        "run_dir": str(run["run_dir"]),
        "num_parameters": run["num_parameters"],
        "model_path": run["model_path"],
        "runtime": cfg.runtime,
        "accounting": accounting(cfg, c, buffers),
        "evals": c.evals,
    }
