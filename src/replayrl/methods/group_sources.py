"""Batch sources that decide per group: DAPO's dynamic sampling and TRL's group replay.

Both plug into the loop as any `BatchSource` (methods/buffer.py): the loop generates one
call's fresh rollouts and asks for (batch, passes). What differs is what they do with groups
that carry no signal (all rewards equal: zero advantage, no gradient, full generation cost):

* `DynamicSamplingSource` (DAPO, arXiv 2503.14476, Algorithm 1 lines 4-8 and eq. 11) drops
  them and calls a `produce` hook for more generation until N groups with variance are in
  hand; surplus groups of the last call are dropped (verl's recipe keeps the first N), or
  with `carry_surplus` (our option) trained first at the next step (`CarriedGroups`).
* `GroupReplaySource` (TRL's former GRPOWithReplayBufferTrainer) trains on the step's groups
  but replaces each zero-std group by a stored earlier group drawn by score
  (`ScoredGroupBuffer`, `trl_group_score`).

Every generated rollout is counted: fresh groups that are trained go through the run's
on-policy queue (pushed, consumed), groups dropped or replaced and surplus groups are counted
as filtered in the run's counters (`rollouts_filtered_*`, in the rollout ledger), extra
generation calls through the same accounting as the first (`Counters.account`), and replayed
rollouts as reused (`rollouts_reused`, per pass), never as generated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from replayrl.config.section import Section
from replayrl.data.buffer import Buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts
from replayrl.data.buffer.scored_groups import ScoredGroupBuffer, trl_group_score
from replayrl.data.groups import Group, flatten, split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import GROUP_STRIDE, SourceContext
from replayrl.methods.grouped import GroupCounters, GroupSource, Production


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling (arXiv 2503.14476, Algorithm 1 lines 4-8): groups whose rewards
    are all equal are dropped and generation continues until the batch holds `train_prompts`
    groups with reward variance."""

    # groups per training batch (the paper's prompt batch size N); None = rollout.prompts_per_step
    train_prompts: int | None = Field(None, ge=1)
    # generation calls of rollout.prompts_per_step prompts per step, the first included. The
    # paper samples until full; verl caps it (max_num_gen_batches) and raises when exceeded.
    # Not specified: our choice: a cap, after which the step trains on the groups it has
    # (counted in dynamic_sampling/short_steps) instead of stopping the run
    max_rounds: int = Field(8, ge=1)
    # a group is kept when its reward std > std_tol (0: any variance)
    std_tol: float = Field(0.0, ge=0)
    # surplus groups with variance from a step's last call: dropped (false, as verl's recipe:
    # counted as filtered_surplus) or trained first at the next step, one policy version old
    # (behaviour log-probs stored; clipped ratio). Not specified: our choice, off by default
    carry_surplus: bool = False


class GroupReplayConfig(Section):
    """TRL's former GRPOWithReplayBufferTrainer (TRL 0.2x experimental, removed by PR #7132):
    groups of a batch with zero reward std are replaced by stored groups that had high reward
    spread, sampled by score."""

    capacity: int = Field(64, ge=1)  # groups kept (TRL's replay_buffer_size, default 64)
    # TRL adds the batch's own variance groups to the store before drawing replacements, so a
    # replacement can repeat a group of the same batch; false draws only from earlier steps.
    # Not specified as a knob in TRL: our choice to expose it (default: TRL's order)
    include_current: bool = True
    # Replayed groups train with their stored behaviour log-probs and stored advantages
    # (importance ratio to the current policy, clipped as any other token). TRL used the
    # trainer's old log-probs when it had them and none otherwise. Not specified: our choice.
    zero_std_tol: float = Field(
        1e-8,
        ge=0,
        description="a group whose reward std is at most this counts as zero-std and is "
        "replaced (TRL: torch.isclose(std, 0))",
    )


if TYPE_CHECKING:
    from replayrl.config.schema import Config


Produce = Callable[[int, int, int], Production]  # (version, step, group_base) -> Production

__all__ = ["GROUP_STRIDE", "GroupCounters", "Production"]  # what the other sources import


def select_signal_groups(
    groups: Sequence[Group], needed: int, tol: float = 0.0
) -> tuple[list[Group], int, list[Group]]:
    """DAPO's filter (arXiv 2503.14476 eq. 11: keep a group iff 0 < #correct < G, i.e. its
    rewards vary): (the first `needed` groups with std > tol, number of rollouts without
    variance, the variance groups beyond `needed`). Order is generation order."""
    kept: list[Group] = []
    surplus: list[Group] = []
    no_signal = 0
    for g in groups:
        if not g.has_signal(tol):
            no_signal += len(g)
        elif len(kept) < needed:
            kept.append(g)
        else:
            surplus.append(g)
    return kept, no_signal, surplus


class CarriedGroups:
    """Surplus groups with variance kept for the next step (`carry_surplus`), with the
    counters of an on-policy queue so the rollout ledger sees them: pushed when carried,
    consumed when trained next step, evicted when the next step does not need them (a carried
    group is never more than one policy version old)."""

    kind = "onpolicy"

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.pushed = self.consumed = self.evicted = 0

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def take(self, needed: int) -> list[Group]:
        """The first `needed` carried groups (consumed); the rest are evicted."""
        used, rest = self.groups[:needed], self.groups[needed:]
        self.consumed += sum(len(g) for g in used)
        self.evicted += sum(len(g) for g in rest)
        for r in flatten(used):
            r.times_sampled += 1
        self.groups = []
        return used

    def carry(self, groups: list[Group]) -> None:
        self.groups += groups
        self.pushed += sum(len(g) for g in groups)

    def stats(self) -> dict[str, float]:
        return {
            "size": float(len(self)),
            "pushed": float(self.pushed),
            "consumed": float(self.consumed),
            "evicted": float(self.evicted),
            "dropped_stale": 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        table, order = encode_rollouts(flatten(self.groups))
        return {
            "rollouts": table,
            "order": order,
            "sizes": [len(g) for g in self.groups],
            "counters": [self.pushed, self.consumed, self.evicted],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat = decode_rollouts(state["rollouts"], state["order"])
        self.groups, at = [], 0
        for k in state["sizes"]:
            self.groups.append(Group(flat[at : at + int(k)]))
            at += int(k)
        self.pushed, self.consumed, self.evicted = (int(x) for x in state["counters"])


class DynamicSamplingSource(GroupSource):
    """DAPO dynamic sampling: a batch of `train_prompts` groups with reward variance, from as
    many generation calls as it takes (at most `max_rounds` per step, the first the loop's).

    `produce(version, step, group_base)` generates and scores one more call of
    rollout.prompts_per_step prompts with the current weights (the run's producer); its cost is
    added to the run's counters here, as the loop does for the first call.
    """

    def __init__(
        self,
        buffer: Buffer,
        produce: Produce | None,
        train_prompts: int,
        prompts_per_call: int,
        epochs: int,
        ds: DynamicSamplingConfig,
    ) -> None:
        super().__init__(buffer, epochs)
        self.produce, self.train_prompts, self.ds = produce, train_prompts, ds
        self.prompts_per_call = prompts_per_call
        # carry_surplus: not specified, our choice (off by default: DAPO/verl drop them)
        self.carried = CarriedGroups() if ds.carry_surplus else None

    def _more(self, version: int, call: int) -> list[Rollout]:
        """Generation call number `call` (>= 1) of this step, accounted like the first."""
        c, produce = self.bound, self.produce
        assert produce is not None
        base = c.step * GROUP_STRIDE + call * self.prompts_per_call
        return self.generate(lambda: produce(version, c.step, base)).rollouts

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c = self.bound
        # carried surplus of the last step first (trained once, one version later: not reuse)
        carried = self.carried.take(self.train_prompts) if self.carried is not None else []
        kept = list(carried)
        rollouts, call = fresh, 0
        while True:
            more, no_signal, surplus = select_signal_groups(
                split_groups(rollouts), self.train_prompts - len(kept), self.ds.std_tol
            )
            kept += more
            c.add("rollouts_filtered_no_signal", no_signal)
            if self.carried is not None:
                self.carried.carry(surplus)
            else:
                c.add("rollouts_filtered_surplus", sum(len(g) for g in surplus))
            call += 1
            if len(kept) >= self.train_prompts or call >= self.ds.max_rounds:
                break
            if self.produce is None:
                break  # no hook (a unit test's source): train on what the first call gave
            rollouts = self._more(version, call)
        if len(kept) < self.train_prompts:
            c.add("short_steps", 1)
        fresh_batch = self.train_fresh(flatten(kept[len(carried) :]), version)
        return flatten(carried) + fresh_batch, self.epochs

    def buffers(self) -> list[Any]:
        return [self.buffer, *([self.carried] if self.carried is not None else [])]

    def parts(self) -> dict[str, Any]:
        return {"carried_groups": self.carried}


class GroupReplaySource(GroupSource):
    """TRL's GRPO with replay buffer: the step's groups with reward variance are trained and
    offered to a `ScoredGroupBuffer` (score `trl_group_score`); each zero-std group is replaced
    by a stored group drawn with probability proportional to its score. With nothing stored
    yet, zero-std groups stay in the batch (no gradient, as plain GRPO): TRL had no rule for
    an empty store. Not specified: our choice."""

    def __init__(
        self, buffer: Buffer, store: ScoredGroupBuffer, epochs: int, gr: GroupReplayConfig
    ) -> None:
        super().__init__(buffer, epochs)
        self.store, self.gr = store, gr

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c = self.bound
        groups = split_groups(fresh)
        signal = [g for g in groups if g.reward_std > self.gr.zero_std_tol]
        zero = [g for g in groups if g.reward_std <= self.gr.zero_std_tol]
        if self.gr.include_current:  # TRL's order: store first, then draw
            self.store.add(signal, [trl_group_score(g) for g in signal])
        replayed = self.store.sample(len(zero)) if zero else []
        if not self.gr.include_current:
            self.store.add(signal, [trl_group_score(g) for g in signal])
        kept_zero = zero[len(replayed) :]  # replaced ones are dropped, counted
        c.add("rollouts_filtered_no_signal", sum(len(g) for g in zero[: len(replayed)]))
        batch = self.train_fresh(flatten(signal + kept_zero), version)
        old = flatten(replayed)
        for r in old:
            r.times_sampled += 1
        c.add("rollouts_reused", len(old) * self.epochs)
        return batch + old, self.epochs

    # the store holds trained rollouts again: reuse, not the ledger (buffers(): the queue)

    def parts(self) -> dict[str, Any]:
        return {"group_store": self.store}


# -- registry entries (methods/__init__.py) ---------------------------------------------


def check_dynamic_sampling(cfg: Config) -> None:
    ds, r = cfg.method.section("dynamic_sampling"), cfg.rollout
    n = ds.train_prompts or r.prompts_per_step
    if cfg.train.batch_size is not None and cfg.train.batch_size != n * r.num_generations:
        raise ValueError(
            f"train.batch_size={cfg.train.batch_size}: dynamic sampling trains on "
            f"method.dynamic_sampling.train_prompts x rollout.num_generations = "
            f"{n * r.num_generations} rollouts (leave train.batch_size unset)"
        )
    cap = cfg.buffer.capacity
    if isinstance(cap, int) and cap < n * r.num_generations:
        raise ValueError(
            f"buffer.capacity={cap} is smaller than the {n * r.num_generations} rollouts "
            "dynamic sampling trains on each step (train_prompts x num_generations): "
            "the queue would evict part of the batch"
        )
    if ds.max_rounds * r.prompts_per_step >= 1_000_000:
        raise ValueError("method.dynamic_sampling.max_rounds x prompts_per_step >= 1e6")


def build_dynamic_sampling(ctx: SourceContext) -> DynamicSamplingSource:
    """`ctx.producer`: the run's own, called until the batch is full (without one it trains
    on the first call's groups)."""
    cfg, ds = ctx.cfg, ctx.section("dynamic_sampling")
    return DynamicSamplingSource(
        ctx.buffer,
        ctx.producer.produce if ctx.producer is not None else None,
        ds.train_prompts or cfg.rollout.prompts_per_step,
        cfg.rollout.prompts_per_step,
        cfg.train.epochs,
        ds,
    )


def check_group_replay(cfg: Config) -> None:
    if cfg.train.batch_size not in (None, cfg.rollouts_per_step):
        raise ValueError(
            f"train.batch_size={cfg.train.batch_size}: group replay trains on the step's "
            f"R = {cfg.rollouts_per_step} rollouts (leave train.batch_size unset)"
        )


def build_group_replay(ctx: SourceContext) -> GroupReplaySource:
    gr = ctx.section("group_replay")
    store = ScoredGroupBuffer(gr.capacity, seed=ctx.cfg.train.seed + 3)
    return GroupReplaySource(ctx.buffer, store, ctx.cfg.train.epochs, gr)
