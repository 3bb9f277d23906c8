"""A run's state outside the loop: counters (saved in checkpoints), the eval record, and the
end-of-run summary and accounting computed from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from replayrl.config.registries import METHODS, RUNTIMES
from replayrl.config.schema import Config
from replayrl.design.theory import estimate_mu
from replayrl.run.records.ledger import (
    RoleClock,
    ledger_stats,
    role_summary,
    rollout_ledger,
    source_terms,
)


@dataclass
class Counters:
    """Cumulative accounting, saved in checkpoints so resumed runs keep counting.

    The fields are the run-wide counts, kept by the loop whatever the batch source; what a
    batch source counts on its own (rollouts it filters or reuses, its extra generation
    rounds...) is in `source_counts`, by the names its registry entry declares
    (`MethodSpec.metrics`), through `add` and `count`. `declared`: those names for this
    run's source (None: any name, as in a unit test's counters); not saved."""

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
    rollouts_dropped_no_reward: int = 0  # every reward function returned None for them
    mu_per_step: list[float] = field(default_factory=list)
    design: dict[str, Any] | None = None  # resolved `auto` buffer design
    reincarnation_step: int | None = None
    evals: list[dict[str, float]] = field(default_factory=list)
    first_reward_error: str | None = None
    rollouts_trained: int = 0  # rollouts in training batches, counted per update pass
    rollouts_sampled: int = 0  # rollouts drawn from the buffer (async replay-ratio pacing)
    rollouts_lost_worker_died: int = 0  # async: the batch a killed generator was producing
    retired_buffer_stats: list[dict[str, float]] = field(default_factory=list)
    # `auto` design's alpha / rho probe: batches of the policies it undoes (run/loops/probe.py)
    rollouts_discarded_probe: int = 0
    roles: dict[str, dict[str, float]] = field(default_factory=dict)  # async role clocks
    source_counts: dict[str, int] = field(default_factory=dict)
    declared: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.declared is not None and (clash := sorted(self.declared & _FIELDS)):
            raise ValueError(f"a batch source declares {clash}: names of run-wide counters")

    def count(self, name: str) -> int:
        """A batch source's counter (`SourceCounter.name`); 0 before its first count."""
        return self.source_counts.get(name, 0)

    def add(self, name: str, n: int) -> None:
        """Add `n` to a batch source's counter, one its registry entry declares."""
        if name in _FIELDS:
            raise ValueError(f"{name!r} is a run-wide counter (a Counters field), not a source's")
        if self.declared is not None and name not in self.declared:
            raise ValueError(
                f"the method counts {name!r}, which its MethodSpec.metrics does not "
                f"declare (declared: {', '.join(sorted(self.declared)) or 'none'})"
            )
        self.source_counts[name] = self.source_counts.get(name, 0) + n

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (all but `declared`, which the config gives again)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "declared"}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], declared: frozenset[str] | None) -> Counters:
        """A checkpoint's counters. Older checkpoints kept the built-in sources' counters as
        fields (`rollouts_reused`, `generation_rounds`, ...) and a plugin's in `extra`: any
        saved count that is not a field now is a source's, so those resume too."""
        kw = {k: v for k, v in state.items() if k in _FIELDS}
        counts = dict(kw.pop("source_counts", {}))
        old = [(k, v) for k, v in state.items() if k not in _FIELDS and k != "extra"]
        for name, n in [*old, *state.get("extra", {}).items()]:
            if type(n) is not int:
                raise ValueError(f"checkpoint counters: {name!r} is {n!r}, not a count")
            if n:  # a zero is no count (the old fields were saved whatever the source)
                counts[name] = counts.get(name, 0) + n
        return cls(**kw, source_counts=counts, declared=declared)

    def account(self, p: Any) -> None:
        """Add one generation batch (a `Production`) to the counters (the ledger's inputs)."""
        self.rollouts_generated += p.generated
        self.tokens_generated += p.tokens
        self.rollouts_dropped_reward_error += p.dropped_reward_error
        self.rollouts_dropped_reward_timeout += p.dropped_reward_timeout
        # a production record from a plugin's own producer may predate this count
        self.rollouts_dropped_no_reward += getattr(p, "dropped_no_reward", 0)
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

    def retire(self, buffer: Any) -> int:
        """Keep a dropped buffer's counters in the ledger; returns its contents, which the
        source counts in its own counter (a `SourceCounter` with `retired=True`)."""
        st = ledger_stats(buffer)
        self.retired_buffer_stats.append({**st, "size": 0.0})
        return int(st["size"])

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


_FIELDS = frozenset(f.name for f in fields(Counters)) - {"declared"}


def declared_counters(cfg: Config) -> frozenset[str]:
    """The counters the run's batch source may add to: those its registry entry declares."""
    return frozenset(m.name for m in METHODS.get(cfg.method.name).metrics)


def source_summary(c: Counters) -> dict[str, int]:
    """summary.json's batch-source counters: every registered source's, under its summary key
    (0 where the run's source has none), then any count no registered source declares (a
    checkpoint's, of a plugin no longer installed) by its name, so none is lost."""
    out: dict[str, int] = {}
    known: set[str] = set()
    for name in METHODS:
        for m in METHODS.get(name).metrics:
            known.add(m.name)
            if m.reported_as is not None:
                out.setdefault(m.reported_as, c.count(m.name))
    return {**out, **{k: v for k, v in c.source_counts.items() if k not in known}}


def ledger(c: Counters, buffers: list[Any]) -> dict[str, Any]:
    terms = [(m.ledger[0], c.count(m.name), m.retired) for m in source_terms() if m.ledger]
    return rollout_ledger(
        c.rollouts_generated,
        c.rollouts_dropped_reward_error,
        c.rollouts_lost_worker_died,
        [*(ledger_stats(b) for b in buffers), *c.retired_buffer_stats],
        discarded_probe=c.rollouts_discarded_probe,
        dropped_no_reward=c.rollouts_dropped_no_reward,
        retired={term: n for term, n, retired in terms if retired},
        filtered={term: n for term, n, retired in terms if not retired},
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
    head = {
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
        "rollouts_dropped_no_reward": c.rollouts_dropped_no_reward,
    }
    counts = source_summary(c)  # the methods' (`MethodSpec.metrics`)
    tail = {
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
    if clash := sorted(counts.keys() & (head.keys() | tail.keys())):
        raise ValueError(f"batch-source counters reported under summary.json's own keys: {clash}")
    return {**head, **counts, **tail}
