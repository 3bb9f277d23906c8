"""Where each step's training batch comes from: a buffer, or ReMix's fresh + window mix.

The loop pushes fresh rollouts and asks for (batch, passes); whether the batch is B samples
of a replay buffer, the freshest R of an on-policy queue, or Mix-PPG's fresh rollouts plus a
share p from the last N_pol policies is this component's business. The synchronous loop
calls `next_batch` (push this step's rollouts, then sample); the asynchronous one `push`es
each delivery as it arrives and `sample`s when `available()` says a batch is there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from replayrl.data.buffer import Buffer, make_buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts
from replayrl.data.rollout import Rollout

if TYPE_CHECKING:
    from replayrl.config.schema import Config, RemixConfig
    from replayrl.data.sources.base import SourceContext

Log = Callable[[str], None]


class Counters(Protocol):
    """What a batch source reads and records in the run's counters (`replayrl.run.state`)."""

    step: int
    reincarnation_step: int | None
    rollouts_generated: int

    def retire(self, buffer: Any) -> int: ...
    def add(self, name: str, n: int) -> None: ...


class BatchSource(Protocol):
    buffer: Buffer  # the run's main buffer (its size is logged each step)

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None: ...
    def push(self, fresh: list[Rollout]) -> None: ...
    def available(self) -> int: ...
    def sample(self, version: int, n: int | None = None) -> tuple[list[Rollout], int]: ...
    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]: ...
    def buffers(self) -> list[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BufferSource:
    """Paper 1: push the fresh rollouts, sample B (on-policy: the freshest; replay: uniform
    or positive-bias over the FIFO), `epochs` passes over it."""

    def __init__(self, buffer: Buffer, batch_size: int, epochs: int) -> None:
        self.buffer, self.batch_size, self.epochs = buffer, batch_size, epochs

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None:
        pass

    def push(self, fresh: list[Rollout]) -> None:
        self.buffer.push(fresh)

    def available(self) -> int:
        """Rollouts a batch can draw from now (the caller drops stale ones first)."""
        return len(self.buffer)

    def sample(self, version: int, n: int | None = None) -> tuple[list[Rollout], int]:
        """(batch, passes): `n` rollouts (default B) sampled at policy `version`."""
        size = self.batch_size if n is None else n
        return self.buffer.sample(size, current_version=version), self.epochs

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        self.push(fresh)
        return self.sample(version)

    def buffers(self) -> list[Any]:
        return [self.buffer]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


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
        """`budget`: the run's generated-rollout budget (remix.reincarnation_at is a share of
        it); `prompts_per_step`: P, of which a fixed-composition mixing step generates
        round((1 - p) P)."""
        super().__init__(buffer, batch_size, rm.utd_after)
        self.window, self.rm = window, rm
        self.budget, self.prompts_per_step = budget, prompts_per_step
        if rm.reincarnation_at is not None and budget is None:
            raise ValueError("remix.reincarnation_at needs the run's generated-rollout budget")
        if rm.composition == "fixed" and prompts_per_step is None:
            raise ValueError("remix.composition=fixed needs rollout.prompts_per_step")
        self.step = 0  # the step about to run (set by before_step)
        self.pending: list[Rollout] = []  # pushed while mixing, not yet in a batch
        self.pending_dropped_stale = 0  # pending rollouts past the buffer's staleness bound

    def reincarnation_due(self, step: int, generated: int) -> bool:
        """At step T (remix.reincarnation_step), or at the first step that starts with
        remix.reincarnation_at x budget rollouts generated."""
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

    def before_step(self, learner: Any, counters: Counters, log: Log) -> None:
        self.step = step = counters.step
        self._drop_stale_pending(getattr(learner, "version", None))
        due = self.reincarnation_due(step, getattr(counters, "rollouts_generated", 0))
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


# -- registry entry (data/sources/__init__.py) -----------------------------------------------


def remix_window(cfg: Config) -> Buffer:
    """ReMix's window of the last N_pol policies' rollouts (sampled without removal)."""
    return make_buffer(
        "replay",
        cfg.remix.num_policies * cfg.rollouts_per_step,
        max_staleness=cfg.remix.num_policies,
        seed=cfg.train.seed + 2,
    )


def build_buffer_source(ctx: SourceContext) -> BufferSource:
    """`groups.source=none`: the buffer's batches (paper 1), or with remix.enabled ReMix's
    mix of fresh and recent policies' rollouts (paper 2), which shares the loop's buffer."""
    cfg = ctx.cfg
    if cfg.remix.enabled:
        return RemixSource(
            ctx.buffer,
            remix_window(cfg),
            cfg.batch_size,
            cfg.remix,
            budget=cfg.generated_budget,
            prompts_per_step=cfg.rollout.prompts_per_step,
        )
    return BufferSource(ctx.buffer, cfg.batch_size, cfg.train.epochs)


def check_buffer_source(cfg: Config) -> None:
    """With remix.enabled, remix.replay_advantage against the registered estimator: a group
    estimator's advantage is computed once at generation (stored: a replayed rollout keeps its
    behaviour group's), a critic estimator's is recomputed with the current critic each step."""
    if not cfg.remix.enabled:
        return
    from replayrl.algorithms import ADVANTAGES  # lazy: reading a config loads no torch

    wanted = cfg.remix.replay_advantage
    critic = ADVANTAGES.get(cfg.algorithm.advantage).needs_critic
    if wanted == "recomputed" and not critic:
        raise ValueError(
            f"remix.replay_advantage=recomputed with algorithm.advantage="
            f"{cfg.algorithm.advantage}: a group advantage cannot be recomputed against pi_k "
            "(pi_k sampled no group for a replayed prompt); use stored, or a critic (gae)"
        )
    if wanted == "stored" and critic:
        raise ValueError(
            f"remix.replay_advantage=stored with algorithm.advantage={cfg.algorithm.advantage}: "
            "the critic's advantages are recomputed at every step, none is stored; use "
            "recomputed"
        )
