"""ExGRPO (Zhan et al., arXiv 2510.02245): experience management and a mixed batch.

Sec. 3.1 of the paper (and the public code, LUFFY repository, ExGRPO/ folder) as components:

* experience: per question, its successful trajectories and its latest correctness rate
  Acc(q) = k / K (`ExperienceStore.update`); a question solved by every rollout (k = K) is
  retired: removed and never stored again (`question_action`);
* partition and sampling: questions are bucketed by their latest k, a bucket is drawn with
  probability proportional to a Gaussian weight N(k; K/2, sigma) (`bucket_weights`, medium
  difficulty first; the code's `normal` weighting, sigma = 1 on the count scale), then
  questions uniformly without replacement inside it (`bucket_counts`, `sample_questions`);
* selection: per replayed question the successful trajectory with the lowest mean token
  entropy under the current policy (`select_trajectory`);
* the batch (sec. 3.2): a share rho of the batch's questions come from experience, each with
  K - 1 fresh rollouts plus the replayed trajectory in one group (advantages over the mixed
  group, `mixed_group_advantages`); the rest are fresh questions with K fresh rollouts.

The loss (on-policy clipped term + shaped importance-weighted term for replayed trajectories)
is the registered policy loss `exgrpo` (algorithms/exgrpo_loss.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import Field

from replayrl.algorithms.advantages import group_advantages
from replayrl.config.section import Section
from replayrl.data.buffer import Buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts, make_rng
from replayrl.data.groups import Group, flatten, split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import GROUP_STRIDE, SourceContext
from replayrl.methods.grouped import GroupSource, RngState

if TYPE_CHECKING:
    from replayrl.config.schema import Config


class ExgrpoConfig(Section):
    """ExGRPO (arXiv 2510.02245): per-question experience of successful
    trajectories, bucketed replay preferring medium difficulty, lowest-entropy selection,
    retirement of always-solved questions, and a mixed batch/objective."""

    # rho: share of a batch's questions replayed from experience (the paper's 0.5);
    # rollout.prompts_per_step is the fresh share, so a batch has prompts_per_step / (1 - rho)
    ratio: float = Field(0.5, ge=0, lt=1)
    # the Gaussian bucket weight's sigma on the count scale (k of K correct; the code's 1)
    sigma: float = Field(1.0, gt=0)
    # entropy: the lowest-entropy successful trajectory (the paper); random: the code's ablation
    selection: Literal["entropy", "random"] = "entropy"
    # the code's delayed start: mixing and collection begin after the first step whose fresh
    # accuracy reaches this (its run script: > 0.35; ours >= so that 0 starts at once)
    start_accuracy: float = Field(0.35, ge=0, le=1)
    # beta of the policy shaping f(w) = w / (w + beta) on replayed tokens (loss exgrpo; 0.1)
    shaping_beta: float = Field(0.1, gt=0)
    # the experience store's bounds (the paper keeps every success; not specified: our
    # choice): distinct successful trajectories kept per question (oldest dropped first; the
    # entropy selection scores each) and questions kept (least recently stored dropped first).
    # Large enough not to bind in the presets' 80-step runs
    store_per_question: int = Field(64, ge=1)
    store_questions: int = Field(
        10_000, ge=1, description="questions kept in the experience store (LRU beyond)"
    )


__all__ = [
    "ExgrpoSource",
    "ExperienceStore",
    "bucket_counts",
    "bucket_weights",
    "check_row",
    "mixed_group_advantages",
    "question_action",
    "replay_count",
    "sample_questions",
    "select_trajectory",
]


# -- pure functions --------------------------------------------------------------------------


def question_action(num_correct: int, size: int) -> str:
    """ExGRPO's collection rule for one fresh group (arXiv 2510.02245 sec. 3.1; the code's
    `experience_lbound=0 < k <= experience_rbound=K-1`): "retire" when every rollout is
    correct (k = K), "skip" when none is (k = 0: nothing to store, the question keeps its
    stored entry), else "store" (its successful trajectories, latest rate k / K)."""
    if size < 1 or not 0 <= num_correct <= size:
        raise ValueError(f"num_correct={num_correct} of a group of {size}")
    if num_correct == size:
        return "retire"
    return "skip" if num_correct == 0 else "store"


def bucket_weights(keys: Sequence[float], group_size: int, sigma: float) -> list[float]:
    """Gaussian bucket weight w(k) = exp(-(k - K/2)^2 / (2 sigma^2)) / sqrt(2 pi sigma^2), k
    the number of correct rollouts out of K (arXiv 2510.02245 sec. 3.1, p(q) proportional to
    N(Acc(q); mu = 0.5, sigma); the code's `_normal_mapping` with mu = K/2, sigma = 1 on the
    count scale, which is what we follow)."""
    if sigma <= 0:
        raise ValueError(f"sigma={sigma}: must be > 0")
    mu = group_size / 2
    c = 1 / math.sqrt(2 * math.pi * sigma**2)
    return [c * math.exp(-((k - mu) ** 2) / (2 * sigma**2)) for k in keys]


def bucket_counts(
    sizes: Sequence[int], weights: Sequence[float], n: int, rng: np.random.Generator
) -> list[int]:
    """How many questions to draw from each bucket (the code's `WeightedBucketSampler.sample`):
    one multinomial draw of n over bucket probabilities weight / sum(weights) (per bucket, not
    per question), counts capped at the bucket's size, and each excess draw re-assigned one at
    a time to a bucket with room, with the original probabilities renormalised over those.
    Total = min(n, sum(sizes))."""
    if len(sizes) != len(weights):
        raise ValueError(f"{len(sizes)} buckets but {len(weights)} weights")
    if n < 0 or any(s < 0 for s in sizes) or any(not w >= 0 for w in weights):
        raise ValueError("bucket_counts: n, sizes and weights must be >= 0")
    live = [i for i, s in enumerate(sizes) if s > 0]
    total_w = sum(weights[i] for i in live)
    if n == 0 or not live:
        return [0] * len(sizes)
    if total_w <= 0:
        raise ValueError("every non-empty bucket has weight 0")
    p = np.array([weights[i] / total_w for i in live])
    drawn = rng.multinomial(n, p / p.sum())
    counts = [0] * len(sizes)
    excess = 0
    for j, i in enumerate(live):
        counts[i] = min(int(drawn[j]), sizes[i])
        excess += int(drawn[j]) - counts[i]
    while excess > 0:
        room = [j for j, i in enumerate(live) if counts[i] < sizes[i]]
        if not room:
            break
        q = p[room] / p[room].sum()
        counts[live[room[int(rng.choice(len(room), p=q))]]] += 1
        excess -= 1
    return counts


def sample_questions(
    rates: dict[str, float], group_size: int, n: int, sigma: float, rng: np.random.Generator
) -> list[str]:
    """n questions (at most all) from `rates` (question -> latest correctness rate): bucketed
    by k = round(rate * K), buckets drawn by `bucket_counts` with `bucket_weights`, questions
    uniformly without replacement within a bucket (arXiv 2510.02245 sec. 3.1). Buckets and
    questions are visited in sorted order so a seeded draw is reproducible."""
    buckets: dict[int, list[str]] = {}
    for q in sorted(rates):
        buckets.setdefault(round(rates[q] * group_size), []).append(q)
    keys = sorted(buckets)
    counts = bucket_counts(
        [len(buckets[k]) for k in keys], bucket_weights(keys, group_size, sigma), n, rng
    )
    out: list[str] = []
    for k, c in zip(keys, counts, strict=True):
        if c:
            idx = rng.choice(len(buckets[k]), size=c, replace=False)
            out += [buckets[k][int(i)] for i in sorted(idx)]
    return out


def select_trajectory(entropies: Sequence[float], mode: str, rng: np.random.Generator) -> int:
    """Index of the trajectory to replay: "entropy" = the lowest mean token entropy under the
    current policy (arXiv 2510.02245 sec. 3.1, the code's `exp_metric=ent`,
    `exp_select_mode=argmin`; the first on ties), "random" = uniform (the code's ablation)."""
    if not entropies:
        raise ValueError("select_trajectory: no trajectories")
    if mode == "entropy":
        return int(np.argmin(np.asarray(entropies, dtype=np.float64)))
    if mode == "random":
        return int(rng.integers(len(entropies)))
    raise ValueError(f"selection mode {mode!r}: must be 'entropy' or 'random'")


def replay_count(fresh_groups: int, ratio: float) -> int:
    """Replayed questions next to `fresh_groups` fresh ones so that they are a share `ratio`
    of the batch (arXiv 2510.02245 sec. 3.2, rho): round(fresh * rho / (1 - rho))."""
    if not 0 <= ratio < 1:
        raise ValueError(f"ratio={ratio}: must be in [0, 1)")
    return int(round(fresh_groups * ratio / (1 - ratio)))


def mixed_group_advantages(
    fresh: Sequence[Rollout], replayed: Rollout, group_id: int, scale_rewards: bool
) -> list[Rollout]:
    """One replayed question's group: its K - 1 fresh rollouts and the replayed trajectory,
    advantages over all K (GRPO's group normalisation, arXiv 2510.02245 sec. 3.2). Returns new
    rollouts (the stored trajectory is not changed); the replayed one keeps its behaviour
    log-probs and version, so the learner sees it as stale (off-policy)."""
    members = [*fresh, replayed]
    adv, means = group_advantages(
        torch.tensor([r.reward for r in members], dtype=torch.float32),
        torch.zeros(len(members), dtype=torch.long),
        scale_rewards,
    )
    return [
        dataclasses.replace(
            r, advantage=float(a), group_mean_reward=float(m), group_id=group_id, extras=r.extras
        )
        for r, a, m in zip(members, adv, means, strict=True)
    ]


def check_row(row: dict[str, Any]) -> None:
    """A task row the store can checkpoint (JSON), else a ValueError saying so: checked when
    the source first sees a row, not at the first mixing step."""
    try:
        json.dumps(row)
    except (TypeError, ValueError) as e:
        raise ValueError(f"ExGRPO stores task rows as JSON; this one is not: {e}") from e


# -- the experience store --------------------------------------------------------------------


class ExperienceStore:
    """Question -> (task row, latest correctness rate, successful trajectories); the retired
    set. Holds references to rollouts already trained once: reuse, never in the ledger.

    Bounded (the paper and its code keep every success; not specified: our choice,
    `method.exgrpo.store_per_question` / `store_questions`): a question keeps its newest
    `per_question` distinct successes (oldest dropped first) and the store its `max_questions`
    most recently stored questions (the least recently stored dropped first, with its row
    and rate). The defaults do not bind in an 80-step run of the presets."""

    kind = "experience"

    def __init__(
        self,
        group_size: int,
        per_question: int = ExgrpoConfig().store_per_question,
        max_questions: int = ExgrpoConfig().store_questions,
    ) -> None:
        if per_question < 1 or max_questions < 1:
            raise ValueError(
                f"per_question={per_question}, max_questions={max_questions}: must be >= 1"
            )
        self.group_size = group_size
        self.per_question, self.max_questions = per_question, max_questions
        self.rows: dict[str, dict[str, Any]] = {}
        self.rates: dict[str, float] = {}
        # least recently stored question first: the eviction order (saved in checkpoints)
        self.trajectories: OrderedDict[str, list[Rollout]] = OrderedDict()
        self.retired: set[str] = set()
        self.evicted_trajectories = self.evicted_questions = 0

    def __len__(self) -> int:
        return len(self.trajectories)

    def update(self, groups: Sequence[Group], rows: dict[int, dict[str, Any]]) -> None:
        """Apply `question_action` to each fresh group (`rows`: group_id -> its task row)."""
        for g in groups:
            q = g.prompt_text
            if q in self.retired:
                continue
            action = question_action(g.num_correct, len(g))
            if action == "retire":
                self.retired.add(q)
                for d in (self.rows, self.rates, self.trajectories):
                    d.pop(q, None)
                continue
            if action == "skip" or g.group_id not in rows:
                continue
            row = rows[g.group_id]
            check_row(row)
            self.rows[q], self.rates[q] = row, g.accuracy
            self._keep(q, [r for r in g.rollouts if r.correct])

    def _keep(self, q: str, successes: Sequence[Rollout]) -> None:
        """Add a question's new distinct successes, then apply the caps (oldest out first)."""
        kept = self.trajectories.setdefault(q, [])
        self.trajectories.move_to_end(q)  # the most recently stored question
        seen = {tuple(r.completion_ids.tolist()) for r in kept}
        for r in successes:
            key = tuple(r.completion_ids.tolist())
            if key not in seen:
                kept.append(r)
                seen.add(key)
        over = max(0, len(kept) - self.per_question)
        self.evicted_trajectories += over
        del kept[:over]
        while len(self.trajectories) > self.max_questions:
            old, dropped = self.trajectories.popitem(last=False)
            self.rows.pop(old, None)
            self.rates.pop(old, None)
            self.evicted_questions += 1
            self.evicted_trajectories += len(dropped)

    def eligible(self) -> dict[str, float]:
        return {q: self.rates[q] for q in self.trajectories if self.trajectories[q]}

    def stats(self) -> dict[str, float]:
        return {
            "questions": float(len(self.trajectories)),
            "trajectories": float(sum(len(v) for v in self.trajectories.values())),
            "retired": float(len(self.retired)),
            "evicted_questions": float(self.evicted_questions),
            "evicted_trajectories": float(self.evicted_trajectories),
        }

    def state_dict(self) -> dict[str, Any]:
        qs = list(self.trajectories)  # eviction order
        table, order = encode_rollouts(r for q in qs for r in self.trajectories[q])
        return {
            "questions": qs,
            "rows": [self.rows[q] for q in qs],
            "rates": [self.rates[q] for q in qs],
            "sizes": [len(self.trajectories[q]) for q in qs],
            "rollouts": table,
            "order": order,
            "retired": sorted(self.retired),
            "evicted": [self.evicted_questions, self.evicted_trajectories],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat = decode_rollouts(state["rollouts"], state["order"])
        self.rows, self.rates, self.trajectories, at = {}, {}, OrderedDict(), 0
        for q, row, rate, k in zip(
            state["questions"], state["rows"], state["rates"], state["sizes"], strict=True
        ):
            self.rows[q], self.rates[q] = dict(row), float(rate)
            self.trajectories[q] = flat[at : at + int(k)]
            at += int(k)
        self.retired = set(state["retired"])
        self.evicted_questions, self.evicted_trajectories = (
            int(x) for x in state.get("evicted", [0, 0])
        )


# -- the batch source ------------------------------------------------------------------------

Produce = Callable[..., Any]  # (version, step, group_base, rows=...) -> Production
Entropies = Callable[[list[Rollout]], list[float]]


class ExgrpoSource(GroupSource):
    """ExGRPO's batch: the step's fresh groups (rollout.prompts_per_step questions, the share
    1 - rho) plus `replay_count` replayed questions, each with K - 1 fresh rollouts generated
    now and its selected stored trajectory. Until mixing starts (the first step whose fresh
    accuracy reaches `start_accuracy`, the code's delayed start) or while the store holds too
    few questions, the missing groups are fresh questions instead, so every batch has the same
    number of groups.

    `produce(version, step, group_base, rows=...)` generates for given task rows (the run's
    producer; `rows()` its last call's group_id -> row); `entropies(rollouts)` the current
    policy's mean token entropy per rollout (the learner's). Extra calls are accounted like
    the loop's; fresh rollouts go through the on-policy queue; replayed ones count as reused.
    """

    def __init__(
        self,
        buffer: Buffer,
        store: ExperienceStore,
        produce: Produce | None,
        rows: Callable[[], dict[int, dict[str, Any]]],
        sample_rows: Callable[[int], list[dict[str, Any]]],
        entropies: Entropies | None,
        epochs: int,
        ex: ExgrpoConfig,
        scale_rewards: bool,
        seed: int,
    ) -> None:
        super().__init__(buffer, epochs)
        self.store, self.ex, self.scale_rewards = store, ex, scale_rewards
        self.produce, self.rows, self.sample_rows = produce, rows, sample_rows
        self.entropies = entropies
        self.rng = make_rng(seed)
        self.mixing = False

    def _call(self, version: int, call: int, rows: list[dict[str, Any]], k: int) -> list[Rollout]:
        """Extra generation call `call` (>= 1) of this step for `rows`, k completions each,
        accounted as the loop accounts its own."""
        c, produce = self.bound, self.produce
        assert produce is not None
        base = c.step * GROUP_STRIDE + call * (GROUP_STRIDE // 16)
        p = self.generate(lambda: produce(version, c.step, base, rows=rows, num_generations=k))
        return list(p.rollouts)

    def _replayed_groups(self, version: int, n: int) -> tuple[list[Group], list[Rollout]]:
        """(mixed groups, their replayed rollouts) of n replayed questions: K - 1 fresh
        rollouts and the selected trajectory each, advantages over the mixed group."""
        c = self.bound
        qs = sample_questions(
            self.store.eligible(), self.store.group_size, n, self.ex.sigma, self.rng
        )
        if not qs:
            return [], []
        fresh = self._call(version, 1, [self.store.rows[q] for q in qs], self.store.group_size - 1)
        by_q: dict[str, list[Rollout]] = {}
        for r in fresh:
            by_q.setdefault(r.prompt_text, []).append(r)
        groups, old = [], []
        for j, q in enumerate(qs):
            cands = self.store.trajectories[q]
            use_entropy = self.entropies is not None and self.ex.selection == "entropy"
            ents = self.entropies(cands) if use_entropy else [0.0] * len(cands)  # type: ignore[misc]
            pick = cands[select_trajectory(ents, self.ex.selection, self.rng)]
            pick.times_sampled += 1
            gid = c.step * GROUP_STRIDE + GROUP_STRIDE // 2 + j
            mixed = mixed_group_advantages(by_q.get(q, []), pick, gid, self.scale_rewards)
            groups.append(Group(mixed))
            old.append(mixed[-1])
        return groups, old

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c = self.bound
        rows = dict(self.rows())  # the loop's call: group_id -> task row
        groups = split_groups(fresh)
        acc = sum(g.num_correct for g in groups) / max(1, sum(len(g) for g in groups))
        target = replay_count(len(groups), self.ex.ratio)
        mixed: list[Group] = []
        replayed: list[Rollout] = []
        if self.mixing and target and self.produce is not None:
            mixed, replayed = self._replayed_groups(version, target)
        missing = target - len(replayed)
        if missing and self.produce is not None:  # fill with fresh questions
            extra = self._call(version, 2, self.sample_rows(missing), self.store.group_size)
            rows.update(self.rows())
            groups += split_groups(extra)
        for row in rows.values():  # now, not at the first mixing step (maybe hours in)
            check_row(row)
        if not self.mixing and acc >= self.ex.start_accuracy:
            self.mixing = True
            self.log(f"ExGRPO: mixing starts (fresh accuracy {acc:.3f} >= start_accuracy)")
        replayed_ids = {id(r) for r in replayed}
        if self.mixing:  # the code collects experience once mixed training has started
            mixed_rows = {g.group_id: self.store.rows[g.prompt_text] for g in mixed}
            # a replayed question's rate and successes come from its K - 1 fresh completions
            # only: the stored trajectory is always correct and is not the policy's success now
            fresh_of = ([r for r in g.rollouts if id(r) not in replayed_ids] for g in mixed)
            mixed_fresh = [Group(f) for f in fresh_of if f]
            self.store.update(groups + mixed_fresh, {**rows, **mixed_rows})
        replay_fresh = [r for g in mixed for r in g.rollouts if id(r) not in replayed_ids]
        batch = self.train_fresh(flatten(groups) + replay_fresh, version)
        c.add("rollouts_reused", len(replayed) * self.epochs)
        return batch + replayed, self.epochs

    def parts(self) -> dict[str, Any]:
        return {"experience": self.store, "exgrpo_rng": RngState(self.rng)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "exgrpo_mixing": self.mixing}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.mixing = bool(state.get("exgrpo_mixing", self.mixing))


# -- registry entry (methods/__init__.py) -----------------------------------------------


def check_exgrpo(cfg: Config) -> None:
    """ExGRPO's rules (its loss is its registry entry's: with another one, e.g. clipped, the
    paper's ablation without policy shaping, the schema warns)."""
    if cfg.train.batch_size is not None:
        raise ValueError(
            "method.name=exgrpo sizes its own batch (rollout.prompts_per_step / "
            "(1 - method.exgrpo.ratio) groups): leave train.batch_size unset"
        )
    cap, ex = cfg.buffer.capacity, cfg.method.section("exgrpo")
    n = (
        cfg.rollouts_per_step
        + round(cfg.rollout.prompts_per_step * ex.ratio / (1 - ex.ratio))
        * cfg.rollout.num_generations
    )
    if isinstance(cap, int) and cap < n:
        raise ValueError(
            f"buffer.capacity={cap} is smaller than the fresh rollouts an ExGRPO step can "
            f"train (up to {n}): the queue would evict part of the batch"
        )


def build_exgrpo(ctx: SourceContext) -> ExgrpoSource:
    """The producer generates for stored questions, the learner scores trajectories by
    entropy (without them: no extra calls, random selection)."""
    cfg, ex, producer, learner = ctx.cfg, ctx.section("exgrpo"), ctx.producer, ctx.learner
    store = ExperienceStore(cfg.rollout.num_generations, ex.store_per_question, ex.store_questions)
    return ExgrpoSource(
        ctx.buffer,
        store,
        producer.produce if producer is not None else None,
        (lambda: producer.last_rows) if producer is not None else dict,
        producer.sample_prompts if producer is not None else (lambda n: []),
        learner.mean_entropies if learner is not None else None,
        cfg.train.epochs,
        ex,
        cfg.algorithm.scale_rewards,
        cfg.train.seed + 4,
    )
