"""Signal replay: GRPO's generation, only the groups with signal trained, and stored signal
groups replayed while fresh signal is scarce (docs/analysis/where-rollouts-go.md).

One step, with GRPO's generation (no extra calls; the run's budget is GRPO's):

1. the step's groups whose rewards are all equal are neither trained nor stored (DAPO's
   filter, arXiv 2503.14476 eq. 11, applied to the batch, not to generation), unless
   `train_zero_advantage`; they are counted as `rollouts_filtered_no_signal`;
2. each group with reward variance is stored whole, with its behaviour log-probs, its group
   advantages and its policy version (the stored fields of arXiv 2604.08706; whole groups as
   in TRL's group replay and ExGRPO, arXiv 2510.02245);
3. fill: when the step has fewer signal groups than `target` times its groups that are not
   all right, stored signal groups are added, freshest first, from the last `window` policy
   versions, each trained at most `max_uses` times in all, its fresh use included
   (`fill_count`). All-right groups call for no fill: a solved prompt has nothing left to
   teach (ExGRPO retires such questions). The replayed share follows the fresh signal, so the
   off-policy phase ends when fresh signal reaches the target, not at a step fixed in advance
   as ReMix's reincarnation (arXiv 2507.06892). Retrieval of stored responses by reward is
   RePO's (arXiv 2506.09340); here it is keyed by signal, not by prompt, because generated
   tasks do not repeat prompts;
4. the batch trains with ReMix's Mix-PPG (loss `mix_ppg`): the ratio against the behaviour
   policy, clipped around pi_k / pi_behaviour for replayed rows, plain clipping for fresh;
5. a stored group is evicted when it is older than `window` versions, has been trained
   `max_uses` times, or its sequence ESS under the current policy (`group_ess`, from the
   learner's `current_logprobs`) is below `min_ess` (arXiv 2604.08706: stale data and very
   high replay ratios hurt).

Counters: `rollouts_reused` (replayed rollouts, per pass), `signal_fill_steps`,
`signal_evicted_age` / `_uses` / `_ess` (groups), `signal_skipped_steps` (steps with nothing
to train). The store is checkpointed with the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from replayrl.algorithms.losses import importance_ess
from replayrl.config.section import Section
from replayrl.data.buffer import Buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts
from replayrl.data.groups import Group, flatten, split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import SourceContext
from replayrl.methods.grouped import GroupSource

if TYPE_CHECKING:
    from replayrl.config.schema import Config


class SignalReplayConfig(Section):
    """Signal replay's settings (`method.signal_replay`)."""

    target: float = Field(
        0.5,
        gt=0,
        le=1,
        description="signal groups a batch should hold, as a share of the step's groups that "
        "are not all right; fewer fresh ones are filled from the store",
    )
    window: int = Field(
        4, ge=1, description="a stored group is replayed at most this many policy versions old"
    )
    max_uses: int = Field(
        4,
        ge=1,
        description="times a stored group is trained in all, its fresh use included (1: "
        "nothing is replayed)",
    )
    min_ess: float = Field(
        0.5,
        ge=0,
        le=1,
        description="evict a stored group whose sequence ESS under the current policy is "
        "below this (0: never computed)",
    )
    train_zero_advantage: bool = Field(
        False, description="train the step's groups without reward variance too"
    )


# -- pure functions --------------------------------------------------------------------------


def all_right(group: Group) -> bool:
    """A solved group: no reward variance and every rollout correct. It calls for no fill."""
    return not group.has_signal() and group.num_correct == len(group)


def fill_count(signal: int, not_all_right: int, target: float) -> int:
    """Stored groups to add so the batch holds ceil(target x not_all_right) signal groups:
    0 once the step's `signal` fresh groups reach that."""
    wanted = math.ceil(target * not_all_right - 1e-9)
    return max(0, wanted - signal)


def group_ess(current: Sequence[torch.Tensor], behaviour: Sequence[torch.Tensor]) -> float:
    """Normalised ESS (sum w)^2 / (n sum w^2) of a group's sequence importance weights
    w_i = prod_t pi(y_it) / pi_beh(y_it) (`importance_ess`): 1 when the current policy has
    moved every member alike, towards 1/n when one member dominates."""
    # the learner's log-probs live on its device, the sampler's on the CPU
    log_w = torch.stack(
        [
            (c.detach().double().cpu() - b.double().cpu()).sum()
            for c, b in zip(current, behaviour, strict=True)
        ]
    )
    return importance_ess(log_w)


# -- the signal store ------------------------------------------------------------------------


@dataclass(eq=False)
class Stored:
    """One stored signal group and the times it has been trained (its fresh use included)."""

    group: Group
    uses: int


class SignalStore:
    """The stored signal groups, oldest first. Holds rollouts already trained once: reuse,
    never in the rollout ledger."""

    kind = "signal"

    def __init__(self) -> None:
        self.items: list[Stored] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, groups: Sequence[Group]) -> None:
        self.items += [Stored(g, 1) for g in groups]

    def remove(self, gone: Sequence[Stored]) -> None:
        ids = {id(s) for s in gone}
        self.items = [s for s in self.items if id(s) not in ids]

    def older_than(self, version: int, window: int) -> list[Stored]:
        """Groups more than `window` versions behind `version`."""
        return [s for s in self.items if version - s.group.policy_version > window]

    def freshest_first(self) -> list[Stored]:
        """Newest policy version first; within a version the least used first (our choice:
        the design fixes only the order by version; this spreads a version's replays over
        its groups), then stored order."""
        return sorted(self.items, key=lambda s: (-s.group.policy_version, s.uses))

    def state_dict(self) -> dict[str, Any]:
        table, order = encode_rollouts(flatten(s.group for s in self.items))
        return {
            "rollouts": table,
            "order": order,
            "sizes": [len(s.group) for s in self.items],
            "uses": [s.uses for s in self.items],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat = decode_rollouts(state["rollouts"], state["order"])
        self.items, at = [], 0
        for k, uses in zip(state["sizes"], state["uses"], strict=True):
            self.items.append(Stored(Group(flat[at : at + int(k)]), int(uses)))
            at += int(k)


# -- the batch source ------------------------------------------------------------------------


class SignalReplaySource(GroupSource):
    """The step's signal groups (and zero-variance ones with `train_zero_advantage`) through
    the on-policy queue, plus `fill_count` stored signal groups when fresh signal is short."""

    def __init__(self, buffer: Buffer, epochs: int, sr: SignalReplayConfig) -> None:
        super().__init__(buffer, epochs)
        self.sr = sr
        self.store = SignalStore()

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c, sr = self.bound, self.sr
        groups = split_groups(fresh)
        signal = [g for g in groups if g.has_signal()]
        zero = [g for g in groups if not g.has_signal()]
        old = self.store.older_than(version, sr.window)
        self.store.remove(old)
        c.add("signal_evicted_age", len(old))
        need = fill_count(len(signal), sum(not all_right(g) for g in groups), sr.target)
        replayed = self._fill(need) if need else []
        if sr.train_zero_advantage:
            trained = groups
        else:
            trained = signal
            c.add("rollouts_filtered_no_signal", sum(len(g) for g in zero))
        batch = self.train_fresh(flatten(trained), version)
        again = flatten(replayed)
        for r in again:
            r.times_sampled += 1
        c.add("rollouts_reused", len(again) * self.epochs)
        c.add("signal_fill_steps", int(bool(replayed)))
        if sr.max_uses > 1:  # a group used up by its fresh use is never stored
            self.store.add(signal)
        if not batch and not again:
            c.add("signal_skipped_steps", 1)
        return batch + again, self.epochs

    def _fill(self, need: int) -> list[Group]:
        """Up to `need` stored groups, freshest first, each passing the ESS test; their use
        counted, and those used `max_uses` times evicted."""
        c = self.bound
        chosen: list[Stored] = []
        queue = self.store.freshest_first()
        while len(chosen) < need and queue:
            take, queue = queue[: need - len(chosen)], queue[need - len(chosen) :]
            ess = self._ess([s.group for s in take])
            low = [s for s, e in zip(take, ess, strict=True) if e < self.sr.min_ess]
            self.store.remove(low)
            c.add("signal_evicted_ess", len(low))
            chosen += [s for s, e in zip(take, ess, strict=True) if e >= self.sr.min_ess]
        for s in chosen:
            s.uses += 1
        spent = [s for s in chosen if s.uses >= self.sr.max_uses]
        self.store.remove(spent)
        c.add("signal_evicted_uses", len(spent))
        return [s.group for s in chosen]

    def _ess(self, groups: Sequence[Group]) -> list[float]:
        """Each group's sequence ESS under the current policy (1.0 without a learner, or
        with min_ess = 0, where it is never compared: no forward pass is spent on it)."""
        if self.learner is None or self.sr.min_ess == 0:
            return [1.0] * len(groups)
        rows = flatten(groups)
        current = self.learner.current_logprobs(rows)
        # against the log pi_old Mix-PPG's ratio uses, so a reduced-precision sampler's noise
        # is not read as the policy's drift
        behaviour = self.learner.behaviour_logprobs(rows)
        out, at = [], 0
        for g in groups:
            out.append(group_ess(current[at : at + len(g)], behaviour[at : at + len(g)]))
            at += len(g)
        return out

    # the store holds trained rollouts again: reuse, not the ledger (buffers(): the queue)

    def parts(self) -> dict[str, Any]:
        return {"signal_store": self.store}


# -- registry entry (methods/__init__.py) ---------------------------------------------------


def check_signal_replay(cfg: Config) -> None:
    """Signal replay sizes its own batch from the step's groups and trains its fresh ones
    through the on-policy queue, which must hold a step's R."""
    if cfg.train.batch_size not in (None, cfg.rollouts_per_step):
        raise ValueError(
            f"train.batch_size={cfg.train.batch_size}: signal replay sizes its own batch "
            "from the step's signal groups and the store (leave train.batch_size unset)"
        )
    cap = cfg.buffer.capacity
    if isinstance(cap, int) and cap < cfg.rollouts_per_step:
        raise ValueError(
            f"buffer.capacity={cap} is smaller than a step's {cfg.rollouts_per_step} fresh "
            "rollouts: the queue would evict part of the batch"
        )


def build_signal_replay(ctx: SourceContext) -> SignalReplaySource:
    """The learner (bound before each step) gives the current policy's log-probs for the ESS
    test; no producer call beyond the loop's."""
    return SignalReplaySource(ctx.buffer, ctx.cfg.train.epochs, ctx.section("signal_replay"))
