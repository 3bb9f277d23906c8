"""No silent non-learning: is there any reward variance for the policy gradient to follow?

Group-relative advantages (GRPO, paper 1's eq. for A_i = (r_i - mean_G) / std_G) are all zero
when every completion of a group gets the same reward: a step whose groups are all-correct or
all-wrong moves nothing but the KL / entropy terms. `RewardSignalMonitor` is fed each step's
fresh rollouts (reward and group id) and returns the step's metrics, like TRL's
`frac_reward_zero_std`, plus a warning once `patience` consecutive steps had no variance at all.
`start_accuracy_warning` says when the starting policy is never right on the eval split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

ZERO_STD = 1e-8  # rewards closer than this count as equal


@dataclass
class SignalReport:
    metrics: dict[str, float]
    warning: str | None = None


@dataclass
class RewardSignalMonitor:
    """Counts steps without reward variance; warns once per run of `patience` such steps.

    Groups of two or more rollouts are scored one by one (TRL's `frac_reward_zero_std`); when
    a step has no such group (PPO's one completion per prompt), the whole step counts as one
    group, so a step where every reward is equal still has no signal.
    """

    patience: int = 5
    streak: int = 0  # consecutive steps without variance so far
    total: int = 0  # steps without variance in the whole run
    warned: bool = False  # warned for the current streak
    _history: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1 (got {self.patience})")

    def state_dict(self) -> dict[str, int | bool]:
        """The counts a resumed run continues from (checkpointed with the run)."""
        return {"streak": self.streak, "total": self.total, "warned": self.warned}

    def load_state_dict(self, state: dict[str, int | bool]) -> None:
        self.streak, self.total = int(state["streak"]), int(state["total"])
        self.warned = bool(state["warned"])

    def update(self, rewards: Iterable[tuple[int, float]]) -> SignalReport:
        """One step's fresh rollouts as (group id, reward) pairs -> metrics and a warning."""
        groups: dict[int, list[float]] = defaultdict(list)
        for gid, r in rewards:
            if r is not None and math.isfinite(r):
                groups[gid].append(float(r))
        sized = [g for g in groups.values() if len(g) >= 2]
        if sized:
            zero = [max(g) - min(g) <= ZERO_STD for g in sized]
            frac = sum(zero) / len(zero)
            no_signal = all(zero)
        else:
            every = [r for g in groups.values() for r in g]
            frac = math.nan  # no group of two: TRL's metric is undefined here
            no_signal = len(every) < 2 or max(every) - min(every) <= ZERO_STD
        every = [r for g in groups.values() for r in g]
        self.streak = self.streak + 1 if no_signal else 0
        self.total += int(no_signal)
        self._history.append(no_signal)
        if not no_signal:
            self.warned = False
        warning = None
        if no_signal and self.streak >= self.patience and not self.warned:
            self.warned = True
            mean = sum(every) / len(every) if every else math.nan
            kind = (
                "every rollout got the same reward"
                if not sized
                else "every group was all-equal (all-correct or all-wrong)"
            )
            warning = (
                f"no learning signal for {self.streak} consecutive steps: {kind} (mean reward "
                f"{mean:.3g}), so every group-relative advantage is 0 and the policy gradient "
                "is empty. The task may be too hard (or too easy) for this policy: check the "
                "warm start's accuracy, the reward function, or rollout.max_new_tokens"
            )
        metrics = {
            "signal/frac_reward_zero_std": frac,
            "signal/no_signal_steps": float(self.streak),
            "signal/no_signal_total": float(self.total),
        }
        return SignalReport(metrics=metrics, warning=warning)


def start_accuracy_warning(
    accuracy: float,
    num_prompts: int,
    tiny_model: bool = True,
    max_new_tokens: int | None = None,
    completions_file: str | None = None,
) -> str | None:
    """A warning when the starting policy solves none of the eval prompts (else None).

    What to try depends on the model: the built-in tiny model (`tiny_model`, no model.path)
    is only as good as its warm start; a real model that is never right is usually cut
    short, prompted in a format it does not answer in, or answering in a form the grader or
    reward does not parse, which its completions show (`completions_file`)."""
    if accuracy > 0:
        return None
    head = (
        f"the starting policy's eval accuracy is 0 on {num_prompts} prompts: with a 0/1 reward "
        "it will rarely be right during training either, and nothing may be learned. "
    )
    if tiny_model:
        return head + (
            "The built-in tiny model is only as good as its warm start: raise "
            "model.warmstart.steps, or use an easier task"
        )
    cut = f"rollout.max_new_tokens={max_new_tokens}" if max_new_tokens else "max_new_tokens"
    see = f" ({completions_file} shows what it writes)" if completions_file else ""
    return head + (
        f"Read the model's completions{see}, then check: the prompt format (a chat model "
        "needs task.chat_template=true, a base model a prompt that ends where the answer "
        f"starts), {cut} (is the answer cut off?), and whether the reward and the grader "
        "parse the answer where the model puts it (last number, \\boxed{}, #### N)"
    )
