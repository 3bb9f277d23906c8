"""Groups as first-class items: a prompt with its G completions, rewards, behaviour log-probs,
the version that generated them.

GRPO's signal lives in groups, not single rollouts: a group whose rewards are all equal has
zero advantage everywhere and gives no gradient (0.44-0.62 of chain's groups late in
a GRPO run). DAPO (arXiv 2503.14476) drops such groups and samples more; TRL's former
GRPOWithReplayBufferTrainer replaces them with stored high-variance groups; AR3PO (arXiv
2509.25808) reuses earlier correct responses per question. All of them need the same record,
so it lives here, beside the single `Rollout`, and wraps the rollouts rather than copying them:
the learner still trains on rollouts, and the existing buffers are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from replayrl.data.rollout_record import Rollout


def reward_std(rewards: Sequence[float]) -> float:
    """Unbiased sample std of a group's rewards (the convention of `group_advantages` and of
    TRL's `rewards.view(-1, G).std(dim=1)`); a single-member group has std 0."""
    n = len(rewards)
    if n < 2:
        return 0.0
    mean = sum(rewards) / n
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))


@dataclass(eq=False)
class Group:
    """One prompt's completions from one generation call (rollouts sharing a `group_id`)."""

    rollouts: list[Rollout]

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("a group needs at least one rollout")
        ids = {r.group_id for r in self.rollouts}
        if len(ids) != 1:
            raise ValueError(f"a group's rollouts must share one group_id, got {sorted(ids)}")

    @property
    def group_id(self) -> int:
        return self.rollouts[0].group_id

    @property
    def prompt_text(self) -> str:
        return self.rollouts[0].prompt_text

    @property
    def policy_version(self) -> int:
        """The oldest version among its rollouts (all equal for a freshly generated group)."""
        return min(r.policy_version for r in self.rollouts)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def advantages(self) -> list[float]:
        return [r.advantage for r in self.rollouts]

    @property
    def num_correct(self) -> int:
        return sum(r.correct for r in self.rollouts)

    @property
    def accuracy(self) -> float:
        return self.num_correct / len(self.rollouts)

    @property
    def reward_std(self) -> float:
        return reward_std(self.rewards)

    def has_signal(self, tol: float = 0.0) -> bool:
        """Whether the rewards vary (std > tol): DAPO's keep rule, arXiv 2503.14476 eq. 11
        (0 < |{o_i : is_equivalent(a, o_i)}| < G) generalised to any reward, as verl's
        `filter_groups` on the std of the sequence reward."""
        return self.reward_std > tol

    def __len__(self) -> int:
        return len(self.rollouts)


def split_groups(rollouts: Iterable[Rollout]) -> list[Group]:
    """Rollouts -> groups by `group_id`, in order of first appearance (rollouts keep their
    order inside a group). Rollouts dropped for a reward error are simply absent, so a group
    may be smaller than G."""
    by_id: dict[int, list[Rollout]] = {}
    for r in rollouts:
        by_id.setdefault(r.group_id, []).append(r)
    return [Group(rs) for rs in by_id.values()]


def flatten(groups: Iterable[Group]) -> list[Rollout]:
    return [r for g in groups for r in g.rollouts]
