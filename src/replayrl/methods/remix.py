"""ReMix (arXiv 2507.06892): Mix-PPG over the fresh rollouts and a share p from the last
N_pol policies' (the window), m passes per batch, then policy reincarnation and plain
on-policy training.

Its settings are `method.remix`; its loss is `mix_ppg` (algorithms/losses.py), its counter
`rollouts_discarded` (the window dropped at reincarnation). It runs on the on-policy queue
of the loop (the fresh rollouts after reincarnation) beside a window of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from replayrl.config.registries import RUNTIMES, runtimes_with
from replayrl.config.section import Section
from replayrl.data.buffer import Buffer, make_buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import LearnerPort, SourceContext
from replayrl.methods.buffer import BufferSource, Counters, Log

if TYPE_CHECKING:
    from replayrl.config.schema import Config


class RemixConfig(Section):
    """ReMix's settings (`method.remix`): Mix-PPG over fresh and recent policies' rollouts, a
    higher update-to-data ratio, then policy reincarnation (arXiv 2507.06892)."""

    off_policy_fraction: float = Field(0.4, ge=0, lt=1)  # p: share of the batch replayed
    num_policies: int = Field(2, ge=1)  # N_pol: replay rollouts of the last N_pol policies
    utd: int = Field(2, ge=1)  # m: gradient passes over each batch before reincarnation
    reincarnation_step: int | None = Field(50, ge=0)  # T; None = never
    reincarnation_at: float | None = Field(
        None,
        gt=0,
        le=1,
        description="policy reincarnation once this fraction of the run's generated-rollout "
        "budget (train.rollout_budget, else train.steps x R) is spent; instead of "
        "reincarnation_step (set that to null)",
    )
    utd_after: int = Field(1, ge=1)  # passes per batch after reincarnation
    composition: Literal["fixed", "additive"] = Field(
        "fixed",
        description="fixed: the paper's batch of B = R rollouts, (1 - p) B fresh (fewer "
        "prompts generated per mixing step) + p B from the window; additive: all R fresh "
        "plus p / (1 - p) R from the window (the presets before this key)",
    )
    replay_advantage: Literal["stored", "recomputed"] | None = Field(
        None,
        description="advantage of a replayed rollout: stored (its behaviour group's, group "
        "estimators) or recomputed (the current critic's GAE, critic estimators); None = "
        "the estimator's only possible one. A group estimator cannot recompute: pi_k never "
        "sampled a group for a replayed prompt",
    )


class PendingRollouts:
    """ReMix's fresh rollouts pushed but not yet in a batch, as the rollout ledger sees them
    (held, like a buffer's contents): an asynchronous run can stop with some."""

    kind = "pending"

    def __init__(self, items: list[Rollout], dropped_stale: int = 0) -> None:
        self.items, self.dropped_stale = items, dropped_stale

    def stats(self) -> dict[str, float]:
        n, d = float(len(self.items)), float(self.dropped_stale)
        return {"size": n, "pushed": n + d, "dropped_stale": d}


def stale_count(fresh: int, batch_size: int, rm: RemixConfig) -> int:
    """Rollouts a Mix-PPG batch draws from the window beside `fresh` new ones (paper 2, sec.
    3.1: a share p of each batch from the last N_pol policies, 1 - p fresh). Fixed: the batch
    is B, so B - fresh (the step generated round((1 - p) B) of them); additive: the batch
    grows to fresh / (1 - p), i.e. round(p / (1 - p) x fresh) stale."""
    p = rm.off_policy_fraction
    if rm.composition == "fixed":
        return max(0, batch_size - fresh)
    return round(p / (1 - p) * fresh)


class RemixSource(BufferSource):
    """ReMix (arXiv 2507.06892): before step T, Mix-PPG batches = the fresh rollouts
    plus a share p sampled (without removal) from the window of the last N_pol policies'
    rollouts, m = utd passes; at step T policy reincarnation (pi_base <- pi_T, the window is
    dropped), then plain on-policy batches with utd_after passes.

    "Fresh" is what was pushed since the last batch: one generation batch in the synchronous
    loop, the deliveries since the last step in the asynchronous one."""

    def __init__(
        self,
        buffer: Buffer,
        window: Buffer | None,
        batch_size: int,
        rm: RemixConfig,
        budget: int | None = None,
        prompts_per_step: int | None = None,
    ):
        """`budget`: the run's generated-rollout budget (method.remix.reincarnation_at is a share of
        it); `prompts_per_step`: P, of which a fixed-composition mixing step generates
        round((1 - p) P)."""
        super().__init__(buffer, batch_size, rm.utd_after)
        self.window, self.rm = window, rm
        self.budget, self.prompts_per_step = budget, prompts_per_step
        if rm.reincarnation_at is not None and budget is None:
            raise ValueError(
                "method.remix.reincarnation_at needs the run's generated-rollout budget"
            )
        if rm.composition == "fixed" and prompts_per_step is None:
            raise ValueError("method.remix.composition=fixed needs rollout.prompts_per_step")
        self.step = 0  # the step about to run (set by before_step)
        self.pending: list[Rollout] = []  # pushed while mixing, not yet in a batch
        self.pending_dropped_stale = 0  # pending rollouts past the buffer's staleness bound

    def reincarnation_due(self, step: int, generated: int) -> bool:
        """At step T (method.remix.reincarnation_step), or at the first step that starts with
        method.remix.reincarnation_at x budget rollouts generated."""
        at = self.rm.reincarnation_at
        if at is not None:
            assert self.budget is not None
            return generated >= at * self.budget
        return step == self.rm.reincarnation_step

    def prompts_this_step(self) -> int | None:
        """Prompts to generate for at the step about to run: round((1 - p) P), at least 1,
        while mixing with the fixed composition (the window fills the rest of B); None = the
        config's P."""
        if self.rm.composition != "fixed" or not self.mixing:
            return None
        assert self.prompts_per_step is not None
        return max(1, round((1 - self.rm.off_policy_fraction) * self.prompts_per_step))

    def before_step(self, learner: LearnerPort, counters: Counters, log: Log) -> None:
        self.step = step = counters.step
        self._drop_stale_pending(learner.version)
        due = self.reincarnation_due(step, counters.rollouts_generated)
        if due and counters.reincarnation_step is None:
            learner.reincarnate()
            if self.window is not None:
                # its contents count as discarded (a ledger term: pushed, never trained)
                counters.add("rollouts_discarded", counters.retire(self.window))
            self.window = None  # from now on plain on-policy training
            counters.reincarnation_step = step
            super().push(self.pending)  # delivered before T: the on-policy queue's now
            self.pending = []
            log(f"policy reincarnation at step {step}: pi_base <- pi_{step}, p = 0")

    def _drop_stale_pending(self, version: int | None) -> None:
        """An asynchronous generator may deliver rollouts more than `max_staleness` versions
        behind the learner: the bound holds for every trained rollout, pending ones included
        (dropped and counted, as the buffer drops its own)."""
        bound = getattr(self.buffer, "max_staleness", None)  # the sharded and plain buffers
        if bound is None or version is None or not self.pending:
            return
        keep = [r for r in self.pending if r.policy_version >= version - bound]
        self.pending_dropped_stale += len(self.pending) - len(keep)
        self.pending = keep

    @property
    def mixing(self) -> bool:
        T = self.rm.reincarnation_step
        return self.window is not None and (T is None or self.step < T)

    def push(self, fresh: list[Rollout]) -> None:
        if self.mixing:
            self.pending.extend(fresh)
        else:
            super().push(fresh)

    def available(self) -> int:
        return len(self.pending) if self.mixing else super().available()

    def sample(self, version: int, n: int | None = None) -> tuple[list[Rollout], int]:
        """Mixing: every pending fresh rollout plus stale ones from the window (`n` does not
        apply): B - fresh of them (fixed composition) or p / (1 - p) x fresh (additive); after
        T: the on-policy queue's batch."""
        if not self.mixing:
            return super().sample(version, n)
        assert self.window is not None
        fresh, self.pending = self.pending, []
        n_stale = stale_count(len(fresh), self.batch_size, self.rm)
        stale = self.window.sample(n_stale, current_version=version) if n_stale else []
        self.window.push(fresh)
        return fresh + stale, self.rm.utd

    def buffers(self) -> list[Any]:
        held = [b for b in (self.buffer, self.window) if b is not None]
        if self.pending or self.pending_dropped_stale:
            return [*held, PendingRollouts(self.pending, self.pending_dropped_stale)]
        return held

    def state_dict(self) -> dict[str, Any]:
        out = {
            **super().state_dict(),
            "window": self.window.state_dict() if self.window is not None else None,
        }
        if self.pending:  # only an asynchronous run stops with deliveries not yet trained on
            table, order = encode_rollouts(self.pending)
            out["pending"] = {"rollouts": table, "order": order}
        if self.pending_dropped_stale:
            out["pending_dropped_stale"] = self.pending_dropped_stale
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        pending = state.get("pending")
        self.pending = decode_rollouts(pending["rollouts"], pending["order"]) if pending else []
        self.pending_dropped_stale = int(state.get("pending_dropped_stale", 0))
        if state.get("window") is None:
            self.window = None  # after reincarnation
        elif self.window is not None:
            self.window.load_state_dict(state["window"])


# -- registry entry (methods/__init__.py) -------------------------------------------------


def remix_window(cfg: Config) -> Buffer:
    """ReMix's window of the last N_pol policies' rollouts (sampled without removal)."""
    rm = cfg.method.section("remix")
    return make_buffer(
        "replay",
        rm.num_policies * cfg.rollouts_per_step,
        max_staleness=rm.num_policies,
        seed=cfg.train.seed + 2,
    )


def build_remix(ctx: SourceContext) -> RemixSource:
    """ReMix's mix of fresh and recent policies' rollouts (paper 2), on the loop's queue."""
    cfg = ctx.cfg
    return RemixSource(
        ctx.buffer,
        remix_window(cfg),
        cfg.batch_size,
        cfg.method.section("remix"),
        budget=cfg.generated_budget,
        prompts_per_step=cfg.rollout.prompts_per_step,
    )


def check_remix(cfg: Config) -> None:
    """ReMix's reincarnation point (one of step and budget share), its fixed composition's
    runtime, and method.remix.replay_advantage against the registered estimator: a group
    estimator's advantage is computed once at generation (stored: a replayed rollout keeps
    its behaviour group's), a critic estimator's is recomputed with the current critic each
    step."""
    rm = cfg.method.section("remix")
    if rm.reincarnation_at is not None and rm.reincarnation_step is not None:
        raise ValueError(
            f"method.remix.reincarnation_at={rm.reincarnation_at} and "
            f"method.remix.reincarnation_step={rm.reincarnation_step}: give one (set "
            "method.remix.reincarnation_step=null)"
        )
    if rm.composition == "fixed" and not RUNTIMES.get(cfg.runtime).lockstep:
        raise ValueError(
            f"method.remix.composition=fixed needs {runtimes_with('lockstep')} (got "
            f"{cfg.runtime}): asynchronous generators do not size their batches by phase; "
            "set method.remix.composition=additive"
        )
    from replayrl.algorithms import ADVANTAGES  # lazy: reading a config loads no torch

    wanted = rm.replay_advantage
    critic = ADVANTAGES.get(cfg.algorithm.advantage).needs_critic
    if wanted == "recomputed" and not critic:
        raise ValueError(
            f"method.remix.replay_advantage=recomputed with algorithm.advantage="
            f"{cfg.algorithm.advantage}: a group advantage cannot be recomputed against pi_k "
            "(pi_k sampled no group for a replayed prompt); use stored, or a critic (gae)"
        )
    if wanted == "stored" and critic:
        raise ValueError(
            f"method.remix.replay_advantage=stored with algorithm.advantage="
            f"{cfg.algorithm.advantage}: the critic's advantages are recomputed at every "
            "step, none is stored; use recomputed"
        )


def steps_budget(cfg: Config) -> bool:
    """Whether train.steps x R is what a run generates: not with the fixed composition,
    whose mixing steps generate (1 - p) R."""
    return bool(cfg.method.section("remix").composition != "fixed")


def steady_batch(cfg: Config) -> bool:
    """Every step trains on B rollouts, except with the additive composition (fresh R plus
    the window's share on top)."""
    return bool(cfg.method.section("remix").composition != "additive")


def passes_change(cfg: Config) -> str | None:
    """Why ReMix's passes per batch change in a run: m = utd until policy reincarnation,
    utd_after from then on (arXiv 2507.06892: plain on-policy updates after T)."""
    rm = cfg.method.section("remix")
    reincarnates = rm.reincarnation_step is not None or rm.reincarnation_at is not None
    if reincarnates and rm.utd != rm.utd_after:
        return (
            f"ReMix takes method.remix.utd={rm.utd} passes over each batch, then "
            f"method.remix.utd_after={rm.utd_after} after policy reincarnation"
        )
    return None
