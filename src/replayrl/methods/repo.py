"""RePO (Li et al., arXiv 2506.09340): per-prompt replay of earlier responses.

The paper's method (sec. 3; its public code, SihengLi99/RePO, `replay_grpo_trainer.py`):

* a replay buffer per prompt holding that prompt's earlier responses with their rewards and
  behaviour log-probs (`PromptReplayStore`; the code: a `deque(maxlen=max_cache_size)` per
  prompt, the oldest response dropped first);
* each step, G_on fresh on-policy responses for the batch's prompts AND, for the same prompts,
  G_off off-policy responses retrieved from their buffers by a replay strategy S
  (`retrieve`: all / random / recency / reward-oriented / variance-driven), once a prompt's
  buffer holds at least `min_buffer` responses (the code's `min_cache_to_replay`); the fresh
  responses are stored after retrieval, so a step never replays its own responses;
* the objective J_RePO(theta; S) = J_on-policy(theta) + J_off-policy(theta; S) (sec. 3, the
  paper's eq. for J_RePO): GRPO's clipped term without KL on the fresh responses, with
  r_on = pi_theta / pi_theta_old, and the same clipped term on the retrieved ones with
  r_off = pi_theta / pi_behaviour, the stored log-probs of the policy that generated them;
* advantages estimated separately (sec. 3, "split" in the code's `adv_norm_mode`): A_on over
  the prompt's G_on fresh rewards (GRPO's, computed at generation), A_off over the G_off
  retrieved rewards (`off_policy_advantages`).

Our choices (not specified in the paper, or changed; said again in docs/methods/repo.md):

* the two terms are not summed as two separately normalised means: the batch (fresh and
  retrieved responses) goes through the configured policy loss once (`grpo_clip` in the
  preset: each retrieved response's ratio is taken against its stored behaviour log-probs,
  the learner's `stale` rollouts), aggregated by `algorithm.loss_agg` over all its tokens;
  this weights the terms by their token counts instead of 1 : 1 (with Adam, a step of the same
  direction up to a factor when every prompt replays);
* a finite prompt pool (`prompt_pool`): the paper trains for several epochs over a fixed
  dataset (its run script: 1,024 prompts, 3 epochs), which is how a prompt comes back with a
  filled buffer; our generated tasks draw a new prompt each time, so the preset draws
  `prompt_pool` training prompts once and visits them in shuffled passes (`PromptPool`);
* the variance-driven strategy (the code's `max_variance_k`, an exhaustive search over all
  k-subsets with ties to the higher reward sum) is computed exactly from the
  sorted rewards: a variance-maximising k-subset is some of the lowest and the rest of the
  highest rewards (`max_variance_subset`);
* `max_prompts`: the number of prompts whose buffers are kept (least recently stored dropped
  first); the code keeps every prompt.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import Field

from replayrl.algorithms.advantages import group_advantages
from replayrl.config.section import Section
from replayrl.data.buffer import Buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts, make_rng
from replayrl.data.groups import split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import GROUP_STRIDE, SourceContext
from replayrl.methods.grouped import GroupSource, RngState

if TYPE_CHECKING:
    from replayrl.config.schema import Config

Strategy = Literal["all", "random", "recency", "reward", "variance"]


class RepoConfig(Section):
    """RePO (arXiv 2506.09340; methods/repo.py): per-prompt replay buffers, off-policy
    responses retrieved for the step's prompts by a replay strategy, trained beside the fresh
    ones with their own advantages."""

    strategy: Strategy = Field(
        "reward",
        description="replay strategy S: all (the full buffer), random, recency (newest), "
        "reward (highest reward), variance (the k-subset of largest reward variance); the "
        "public code's run script uses reward (`highest_k`)",
    )
    num_replays: int = Field(
        8, ge=1, description="G_off: responses retrieved per prompt (not with strategy=all)"
    )
    buffer_size: int = Field(
        16, ge=1, description="responses kept per prompt, oldest dropped first (the code's 16)"
    )
    min_buffer: int = Field(
        16,
        ge=1,
        description="a prompt replays only once its buffer holds this many (the code's 16)",
    )
    prompt_pool: int | None = Field(
        None,
        ge=1,
        description="training prompts drawn once and visited in shuffled passes (the paper's "
        "fixed dataset over epochs); None: the task's own sampler",
    )
    max_prompts: int = Field(
        10_000, ge=1, description="prompts whose buffers are kept (least recent dropped)"
    )


__all__ = [
    "PromptPool",
    "PromptReplayStore",
    "RepoConfig",
    "RepoSource",
    "max_variance_subset",
    "off_policy_advantages",
    "retrieve",
]


# -- pure functions --------------------------------------------------------------------------


def max_variance_subset(rewards: Sequence[float], k: int) -> list[int]:
    """Indices (ascending) of a k-subset of `rewards` with the largest population variance,
    ties to the larger reward sum (RePO's variance-driven strategy, arXiv 2506.09340 sec. 3;
    the code's `max_variance_k`).

    Exact without enumerating subsets: for a fixed size, moving a member towards the middle
    of the sorted rewards never raises the sum of squared deviations (it is convex in each
    member), so an optimum takes the j lowest and the k - j highest rewards for some j; all
    k + 1 such subsets are compared. Equal rewards are ordered by index (oldest first)."""
    n = len(rewards)
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be in 1..{n}")
    order = sorted(range(n), key=lambda i: (rewards[i], i))
    best: tuple[float, float] | None = None
    pick: list[int] = []
    for j in range(k + 1):
        chosen = order[:j] + order[n - (k - j) :]
        vals = np.asarray([rewards[i] for i in chosen], dtype=np.float64)
        key = (float(vals.var()), float(vals.sum()))
        if best is None or key > best:
            best, pick = key, chosen
    return sorted(pick)


def retrieve(
    rewards: Sequence[float], strategy: str, k: int, rng: np.random.Generator
) -> list[int]:
    """Which of a prompt's stored responses to replay (indices into its buffer, oldest
    first): RePO's replay strategies (arXiv 2506.09340 sec. 3, "replay strategies"; the
    code's `_replay_step`). `all`: every response; `random`: k uniformly without
    replacement; `recency`: the k newest; `reward`: the k highest rewards (the older first
    on ties, the code's stable sort); `variance`: `max_variance_subset`. k is capped at the
    buffer's size. Returned in buffer order."""
    n = len(rewards)
    if n == 0:
        return []
    if k < 1:
        raise ValueError(f"k={k}: must be >= 1")
    k = min(k, n)
    if strategy == "all":
        return list(range(n))
    if strategy == "random":
        return sorted(int(i) for i in rng.choice(n, size=k, replace=False))
    if strategy == "recency":
        return list(range(n - k, n))
    if strategy == "reward":
        return sorted(sorted(range(n), key=lambda i: -rewards[i])[:k])
    if strategy == "variance":
        return max_variance_subset(rewards, k)
    raise ValueError(
        f"replay strategy {strategy!r}: must be all, random, recency, reward or variance"
    )


def off_policy_advantages(
    retrieved: Sequence[Rollout], group_id: int, scale_rewards: bool
) -> list[Rollout]:
    """A_off: the retrieved responses of one prompt normalised among themselves (GRPO's
    group normalisation over the G_off stored rewards, arXiv 2506.09340 sec. 3; the code's
    `adv_norm_mode=split`), not with the fresh ones. New rollouts (the stored ones keep
    their values); each keeps its behaviour log-probs and policy version, so the learner
    sees it as stale and takes its ratio against the policy that generated it."""
    if not retrieved:
        return []
    adv, means = group_advantages(
        torch.tensor([r.reward for r in retrieved], dtype=torch.float32),
        torch.zeros(len(retrieved), dtype=torch.long),
        scale_rewards,
    )
    return [
        dataclasses.replace(r, advantage=float(a), group_mean_reward=float(m), group_id=group_id)
        for r, a, m in zip(retrieved, adv, means, strict=True)
    ]


# -- the per-prompt replay buffers -----------------------------------------------------------


class PromptReplayStore:
    """Prompt text -> its most recent `buffer_size` responses (oldest first). Holds
    references to rollouts already trained once: reuse, never in the ledger. At most
    `max_prompts` prompts (the least recently stored dropped first: our bound)."""

    kind = "prompt_replay"

    def __init__(self, buffer_size: int, max_prompts: int) -> None:
        if buffer_size < 1 or max_prompts < 1:
            raise ValueError(f"buffer_size={buffer_size}, max_prompts={max_prompts}: need >= 1")
        self.buffer_size, self.max_prompts = buffer_size, max_prompts
        self.responses: OrderedDict[str, list[Rollout]] = OrderedDict()
        self.evicted_prompts = 0

    def __len__(self) -> int:
        return len(self.responses)

    def get(self, prompt: str) -> list[Rollout]:
        return self.responses.get(prompt, [])

    def add(self, fresh: Sequence[Rollout]) -> None:
        """Store a step's fresh responses under their prompts (after retrieval)."""
        for r in fresh:
            kept = self.responses.setdefault(r.prompt_text, [])
            self.responses.move_to_end(r.prompt_text)
            kept.append(r)
            del kept[: max(0, len(kept) - self.buffer_size)]
        while len(self.responses) > self.max_prompts:
            self.responses.popitem(last=False)
            self.evicted_prompts += 1

    def stats(self) -> dict[str, float]:
        return {
            "prompts": float(len(self.responses)),
            "responses": float(sum(len(v) for v in self.responses.values())),
            "evicted_prompts": float(self.evicted_prompts),
        }

    def state_dict(self) -> dict[str, Any]:
        prompts = list(self.responses)
        table, order = encode_rollouts(r for p in prompts for r in self.responses[p])
        return {
            "prompts": prompts,
            "sizes": [len(self.responses[p]) for p in prompts],
            "rollouts": table,
            "order": order,
            "evicted_prompts": self.evicted_prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat = decode_rollouts(state["rollouts"], state["order"])
        self.responses, at = OrderedDict(), 0
        for p, k in zip(state["prompts"], state["sizes"], strict=True):
            self.responses[p] = flat[at : at + int(k)]
            at += int(k)
        self.evicted_prompts = int(state.get("evicted_prompts", 0))


class PromptPool:
    """A fixed set of training prompts visited in shuffled passes (the paper's dataset over
    epochs; not specified for generated tasks: our choice). Stands in for the producer's task:
    `sample_train` serves the pool, everything else is the task's."""

    def __init__(self, task: Any, size: int, seed: int) -> None:
        self.task, self.rng = task, make_rng(seed)
        self.rows = task.sample_train(size, make_rng(seed + 1))
        self.order: list[int] = []
        self.passes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def sample_train(self, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
        """The next n pool rows (`rng` is not used: the pool's order is its own)."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            if not self.order:
                self.order = [int(i) for i in self.rng.permutation(len(self.rows))]
                self.passes += 1
            out.append(dict(self.rows[self.order.pop(0)]))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order, "passes": self.passes, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        order = [int(i) for i in state["order"]]
        if any(not 0 <= i < len(self.rows) for i in order):
            raise ValueError(
                f"method.repo.prompt_pool={len(self.rows)}: the checkpoint's pool pass visits "
                f"prompt {max(order)}; resume with the run's own prompt_pool"
            )
        self.order, self.passes = order, int(state["passes"])
        self.rng.bit_generator.state = state["rng"]


# -- the batch source ------------------------------------------------------------------------


class RepoSource(GroupSource):
    """RePO's batch: the step's fresh groups (G_on per prompt, GRPO advantages) plus, for
    each of those prompts whose buffer holds `min_buffer` responses, G_off responses
    retrieved by the strategy with advantages among themselves; then the fresh responses are
    stored. Retrieved responses count as reused (`rollouts_reused`, per pass), never as
    generated; the generated budget is the loop's alone."""

    def __init__(
        self,
        buffer: Buffer,
        store: PromptReplayStore,
        rp: RepoConfig,
        epochs: int,
        scale_rewards: bool,
        seed: int,
        pool: PromptPool | None = None,
    ) -> None:
        super().__init__(buffer, epochs)
        self.store, self.rp, self.scale_rewards, self.pool = store, rp, scale_rewards, pool
        self.rng = make_rng(seed)

    def replayed(self, fresh: list[Rollout], step: int) -> list[Rollout]:
        """The off-policy responses for the fresh groups' prompts (before storing them)."""
        out: list[Rollout] = []
        for j, g in enumerate(split_groups(fresh)):
            stored = self.store.get(g.prompt_text)
            if len(stored) < self.rp.min_buffer:
                continue
            idx = retrieve(
                [r.reward for r in stored], self.rp.strategy, self.rp.num_replays, self.rng
            )
            for i in idx:
                stored[i].times_sampled += 1
            gid = step * GROUP_STRIDE + GROUP_STRIDE // 2 + j
            out += off_policy_advantages([stored[i] for i in idx], gid, self.scale_rewards)
        return out

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c = self.bound
        old = self.replayed(fresh, c.step)  # before storing: a step never replays its own
        self.store.add(fresh)
        batch = self.train_fresh(fresh, version)
        c.add("rollouts_reused", len(old) * self.epochs)
        return batch + old, self.epochs

    def parts(self) -> dict[str, Any]:
        return {
            "prompt_replay": self.store,
            "repo_rng": RngState(self.rng),
            "prompt_pool": self.pool,
        }


# -- registry entry (methods/__init__.py) -----------------------------------------------


def check_repo(cfg: Config) -> None:
    """RePO's rules: fresh groups of the synchronous loop, a batch it sizes itself, buffers
    that can reach `min_buffer` (a loss other than its registry entry's warns: RePO's
    off-policy term is GRPO's clipped ratio against the stored behaviour policy)."""
    rp = cfg.method.section("repo")
    if cfg.train.batch_size is not None:
        raise ValueError(
            "method.name=repo sizes its own batch (the fresh rollouts plus the replayed "
            "ones): leave train.batch_size unset"
        )
    if rp.min_buffer > rp.buffer_size:
        raise ValueError(
            f"method.repo.min_buffer={rp.min_buffer} > method.repo.buffer_size="
            f"{rp.buffer_size}: no prompt's buffer could ever replay"
        )
    cap = cfg.buffer.capacity
    if isinstance(cap, int) and cap < cfg.rollouts_per_step:
        raise ValueError(
            f"buffer.capacity={cap} is smaller than a step's fresh rollouts "
            f"({cfg.rollouts_per_step}): the queue would evict part of the batch"
        )


def build_repo(ctx: SourceContext) -> RepoSource:
    """With `prompt_pool`, the producer's task is served through a `PromptPool` (without a
    producer, as in unit tests, there is no pool)."""
    cfg, rp, producer = ctx.cfg, ctx.section("repo"), ctx.producer
    pool = None
    if rp.prompt_pool is not None and producer is not None:
        size, seed = rp.prompt_pool, cfg.train.seed + 5
        pool = producer.serve_prompts_through(lambda task: PromptPool(task, size, seed))
    return RepoSource(
        ctx.buffer,
        PromptReplayStore(rp.buffer_size, rp.max_prompts),
        rp,
        cfg.train.epochs,
        cfg.algorithm.scale_rewards,
        cfg.train.seed + 6,
        pool,
    )
