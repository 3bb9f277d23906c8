"""Where every generated rollout went, and where every role's time went.

The ledger must balance: generated = dropped (reward error) + dropped with no reward (every
reward function returned None) + lost (worker died mid-batch)
+ in a buffer + evicted + consumed (removed by on-policy sampling) + dropped as stale
+ the terms batch sources declare in their registry entries (`SourceCounter.ledger`): retired
(the contents of a buffer a source dropped, e.g. ReMix's window at reincarnation) and
filtered (never pushed to a buffer: e.g. groups without reward variance dropped or replaced,
surplus groups beyond a full batch) + discarded by the `auto` design's alpha / rho probe (its
warm-up batches after the first and its own batch came from policies it undoes; never
pushed). Replayed rollouts are reuse, not generation: they appear in no ledger term (the
summary's `rollouts_reused` counts them). A run that does not balance says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from replayrl.config.registries import METHODS, SourceCounter
from replayrl.design.theory import cost_ratio, gamma

BUFFER_KEYS = ("size", "evicted", "consumed", "dropped_stale", "pushed")


def source_terms() -> list[SourceCounter]:
    """The counters with a ledger term (`SourceCounter.ledger`) of every registered batch
    source, each term once: every ledger has the same terms, whichever source the run used."""
    seen: dict[str, SourceCounter] = {}
    for name in METHODS:
        for m in METHODS.get(name).metrics:
            if m.ledger is not None:
                seen.setdefault(m.ledger[0], m)
    return list(seen.values())


def ledger_stats(buffer: Any) -> dict[str, float]:
    """A buffer's counters for the ledger: a replay buffer's `consumed` counts draws, not
    removals (its rollouts stay until evicted), so it is reported as `sampled` instead."""
    st = dict(buffer.stats())
    kind = getattr(buffer, "shard_kind", None) or getattr(buffer, "kind", "")
    if kind == "replay":
        st["sampled"], st["consumed"] = st.get("consumed", 0.0), 0.0
    return st


def rollout_ledger(
    generated: int,
    dropped_reward_error: int,
    lost_worker_died: int,
    buffer_stats: Iterable[dict[str, float]],
    discarded_probe: int = 0,
    retired: dict[str, int] | None = None,
    filtered: dict[str, int] | None = None,
    dropped_no_reward: int = 0,
) -> dict[str, Any]:
    """Sum the buffers' counters and check that generated rollouts are all accounted for.
    The terms batch sources declare (`source_terms`), ledger term -> rollouts: `retired`,
    pushed to a buffer the source then dropped; `filtered`, generated but never pushed."""
    retired, filtered = dict(retired or {}), dict(filtered or {})
    totals = dict.fromkeys(BUFFER_KEYS, 0)
    for st in buffer_stats:
        for k in BUFFER_KEYS:
            totals[k] += int(st.get(k, 0))
    accounted = (
        dropped_reward_error
        + dropped_no_reward
        + lost_worker_died
        + totals["size"]
        + totals["evicted"]
        + totals["consumed"]
        + totals["dropped_stale"]
        + sum(retired.values())
        + sum(filtered.values())
        + discarded_probe
    )
    stored = totals["size"] + totals["evicted"] + totals["consumed"] + totals["dropped_stale"]
    return {
        "generated": generated,
        "dropped_reward_error": dropped_reward_error,
        "dropped_no_reward": dropped_no_reward,
        "lost_worker_died": lost_worker_died,
        "in_buffer": totals["size"],
        "evicted": totals["evicted"],
        "consumed": totals["consumed"],
        "dropped_stale": totals["dropped_stale"],
        **retired,
        **filtered,
        "discarded_probe": discarded_probe,
        "pushed": totals["pushed"],
        "balanced": accounted == generated and stored + sum(retired.values()) == totals["pushed"],
    }


@dataclass
class RoleClock:
    """Busy / idle seconds and throughput of one role (a generator worker or a learner)."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    rollouts: int = 0  # produced (generator) or trained on, per pass (learner)
    tokens: int = 0
    batches: int = 0
    restarts: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        total = self.busy_s + self.idle_s
        return {
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "busy_frac": self.busy_s / total if total else 0.0,
            "rollouts": self.rollouts,
            "tokens": self.tokens,
            "batches": self.batches,
            "restarts": self.restarts,
            **self.extra,
        }


def role_summary(roles: dict[str, dict[str, float]], workers: int, trainers: int) -> dict:
    """Measured mu (generation vs training seconds per sample) and paper 1's gamma.

    mu here is `cost_ratio` over the whole run's busy time (all generators' busy seconds per
    rollout over all learners' busy seconds per trained rollout), not the summary's median of
    per-step values: in the async runtimes generators and learners run concurrently on their
    own batches, so there is no step pairing one generation with one update to take a ratio of.
    Sync runs report both (this from their cumulative generation/training seconds)."""
    gen = [r for k, r in roles.items() if k.startswith("generator")]
    learn = [r for k, r in roles.items() if k.startswith("learner")]
    gen_busy, gen_n = sum(r["busy_s"] for r in gen), sum(r["rollouts"] for r in gen)
    tr_busy, tr_n = sum(r["busy_s"] for r in learn), sum(r["rollouts"] for r in learn)
    mu = cost_ratio(gen_busy, gen_n, tr_busy, tr_n)
    return {
        "roles": roles,
        "mu": mu,
        "workers": workers,
        "trainers": trainers,
        "gamma": gamma(mu, workers, trainers) if mu is not None else None,
    }


WALL_SECONDS_COVERS = (
    "the training loop only (generation, rewards, training steps); model loading, warm "
    "start, evaluations and checkpoints are not in it"
)


def format_accounting(ledger: dict[str, Any], summary: dict[str, Any], show_mu: bool = True) -> str:
    """The end-of-run report: one line per role, then the rollout ledger. `show_mu`: the
    mu / gamma line, which matters where generators run beside learners (async runtimes) or
    where `auto` sized the buffer from mu; a synchronous run's summary.json has them anyway."""
    lines = ["accounting (seconds busy / idle, rollouts, tokens):"]
    for name, r in summary["roles"].items():
        lines.append(
            f"  {name:<12} busy {r['busy_s']:8.1f} s  idle {r['idle_s']:8.1f} s "
            f"({100 * r['busy_frac']:3.0f}% busy)  rollouts {int(r['rollouts']):>8,}  "
            f"tokens {int(r['tokens']):>9,}"
            + (f"  restarts {int(r['restarts'])}" if r.get("restarts") else "")
        )
    mu, g = summary.get("mu"), summary.get("gamma")
    if mu is not None and show_mu:
        lines.append(
            f"  measured mu = {mu:.3g}: generating a rollout took {mu:.3g}x the time of "
            f"training on one; gamma = (1 + W/T)/(1 + mu) = {g:.3g} for W={summary['workers']} "
            f"generator(s), T={summary['trainers']} learner(s): paper 1's compute per baseline "
            "update"
        )
    led = ledger
    lines.append(
        f"rollouts: generated {led['generated']:,} = in buffer {led['in_buffer']:,} + consumed "
        f"{led['consumed']:,} + evicted {led['evicted']:,} + dropped stale "
        f"{led['dropped_stale']:,} + dropped reward error {led['dropped_reward_error']:,} + lost "
        f"with a dead worker {led['lost_worker_died']:,}"
        + "".join(
            f" + {m.ledger[1]} {led[m.ledger[0]]:,}"
            for m in source_terms()
            if m.ledger and led.get(m.ledger[0])
        )
        + (
            f" + no reward (every function returned None) {led['dropped_no_reward']:,}"
            if led.get("dropped_no_reward")
            else ""
        )
        + (
            f" + discarded by the design probe {led['discarded_probe']:,}"
            if led.get("discarded_probe")
            else ""
        )
        + (" (balanced)" if led["balanced"] else "  NOT BALANCED: please report this")
    )
    return "\n".join(lines)
