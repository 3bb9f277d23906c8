"""The producer side of the loop: prompts -> samples -> rewards -> rollouts with advantages.

One class for every runtime: the synchronous session calls it in-process, asynchronous
generator workers (local processes or Ray actors) call it in a loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from replayrl.algorithms import ADVANTAGES
from replayrl.algorithms.advantages import group_means
from replayrl.config.schema import Config
from replayrl.data.rollout_record import Rollout
from replayrl.errors import RunFailed
from replayrl.rollout.generation import Generator, Sample, SamplingParams
from replayrl.rollout.prompts import PromptRenderer, is_conversational, prompt_fits
from replayrl.rollout.rewards import score

Row = dict[str, Any]  # a task row: prompt and answer columns

Log = Callable[[str], None]
T = TypeVar("T")

MAX_EMPTY_STEPS = 5  # consecutive steps whose prompts are all too long before the run stops


@dataclass
class Production:
    """One generation batch and what it cost; the counts feed the rollout ledger."""

    rollouts: list[Rollout]
    stats: dict[str, float]
    generated: int  # samples drawn, including those whose reward failed
    tokens: int  # completion tokens sampled
    dropped_reward_error: int
    skipped_too_long: int
    first_error: str | None
    seconds: float  # generation + scoring
    dropped_reward_timeout: int = 0  # of dropped_reward_error: reward calls that timed out
    reward_seconds: float = 0.0  # of seconds: in reward functions
    dropped_no_reward: int = 0  # every reward function returned None for them (not errors)


@dataclass
class RolloutProducer:
    """Samples `prompts_per_step` prompts, generates G completions each, scores them and
    turns them into rollouts carrying behaviour log-probs and, for an estimator that runs at
    generation (`algorithm.advantage`: grpo, rloo, ...), its advantages."""

    cfg: Config
    task: Any
    rewards: Any
    tokenizer: Any
    render: PromptRenderer
    generator: Generator
    max_positions: int | None
    prompt_rng: np.random.Generator
    log: Log = print
    _reported_error: bool = field(default=False, init=False)
    _reported_no_reward: bool = field(default=False, init=False)
    _no_reward_steps: int = field(default=0, init=False)  # steps in a row with no reward at all
    _empty_steps: int = field(default=0, init=False)  # consecutive steps with no prompt left
    # the latest call's rows by the prompt text generated from (a source that generates for
    # some of them again passes those rows back: AR3PO's rounds)
    rows_by_text: dict[str, Any] = field(default_factory=dict, init=False)
    last_rows: dict[int, Row] = field(default_factory=dict, init=False)  # of the last call

    def sample_prompts(self, n: int) -> list[Row]:
        """`n` new task rows from the run's prompt stream (a method topping up a batch)."""
        return list(self.task.sample_train(n, self.prompt_rng))

    def serve_prompts_through(self, wrap: Callable[[Any], T]) -> T:
        """Sample new prompts from `wrap(task)` from now on (a method's prompt pool, which
        serves `sample_train` and hands the rest to the task); returns it."""
        served = wrap(self.task)
        self.task = served
        return served

    def fits(self, prompt: str) -> bool:
        return prompt_fits(
            self.tokenizer, prompt, self.max_positions, self.cfg.rollout.max_new_tokens
        )

    def _rows(
        self, given: list[Row] | None, num_prompts: int | None = None
    ) -> tuple[list[Any], list[str]]:
        """(rows, texts generated from): the `given` task rows, or `num_prompts` newly sampled
        ones (default rollout.prompts_per_step)."""
        rows = given
        if rows is None:
            rows = self.task.sample_train(
                num_prompts or self.cfg.rollout.prompts_per_step, self.prompt_rng
            )
        # the text generated from (chat template); rows keep their prompt for reward functions
        texts = [self.render(row["prompt"]) for row in rows]
        self.rows_by_text = dict(zip(texts, rows, strict=True))
        return rows, texts

    def produce(
        self,
        version: int,
        step: int,
        group_base: int,
        rows: list[Row] | None = None,
        num_generations: int | None = None,
        num_prompts: int | None = None,
    ) -> Production:
        """Generate with weights of `version`; group ids are `group_base + prompt index`.
        `rows`: generate for these task rows instead of sampling new prompts (the one hook of
        the batch sources that revisit prompts: AR3PO's rounds, ExGRPO's stored questions);
        `num_generations`: completions per prompt (default rollout.num_generations);
        `num_prompts`: new prompts to sample (default rollout.prompts_per_step; ReMix's fixed
        composition generates fewer while mixing). `last_rows` maps the call's group ids to
        their rows."""
        t0 = time.perf_counter()
        r = self.cfg.rollout
        rows, texts = self._rows(rows, num_prompts)
        fits = [self.fits(t) for t in texts]
        kept = [row for row, ok in zip(rows, fits, strict=True) if ok]
        kept_texts = [t for t, ok in zip(texts, fits, strict=True) if ok]
        if not kept:
            return self._all_too_long(len(rows), t0)
        self._empty_steps = 0
        self.last_rows = {group_base + i: row for i, row in enumerate(kept)}
        self.generator.policy_version = version
        samples = self.generator.generate(
            kept_texts, num_generations or r.num_generations, sampling_params(r)
        )
        sample_rows = [kept[s.prompt_index] for s in samples]
        pairs = list(zip(samples, sample_rows, strict=True))
        result = score(
            self.rewards,
            [row["prompt"] for row in sample_rows],
            [completion_for_reward(s.text, row["prompt"]) for s, row in pairs],
            sample_rows,
            timeout_s=r.reward_timeout_s,
            patience=self.cfg.train.failure_patience,  # a function failing every call: stop
            isolation=r.reward_isolation,
        )
        if result.first_error and not self._reported_error:
            self._reported_error = True
            self.log(f"warning: {result.first_error} (those rollouts are dropped and counted)")
        self._check_no_reward(result.no_reward, len(samples), result.first_no_reward)
        correct = [self.task.is_correct(s.text, row) for s, row in pairs]
        rollouts = self._to_rollouts(
            samples,
            [kept_texts[s.prompt_index] for s in samples],
            result.rewards,
            correct,
            step,
            group_base,
        )
        # each function's own reward, for the completions log (combined: rollout.reward)
        kept_idx = [i for i, x in enumerate(result.rewards) if x is not None]
        for ro, i in zip(rollouts, kept_idx, strict=True):
            ro.extras["rewards"] = {n: v[i] for n, v in result.per_function.items()}
        stats = _production_stats(samples, result, correct)
        stats["time/reward_s"] = result.seconds
        return Production(
            rollouts=rollouts,
            stats=stats,
            generated=len(samples),
            tokens=sum(s.completion_ids.numel() for s in samples),
            dropped_reward_error=result.errors,
            skipped_too_long=len(rows) - len(kept),
            first_error=result.first_error,
            seconds=time.perf_counter() - t0,
            dropped_reward_timeout=result.reasons.get("timeout", 0),
            reward_seconds=result.seconds,
            dropped_no_reward=result.no_reward,
        )

    def _check_no_reward(self, k: int, n: int, prompt: str | None) -> None:
        """Rollouts no reward function gave a value for are skipped and counted; the first
        time it happens the run says so (in TRL's words), and `train.failure_patience` steps
        in a row of nothing else end the run, since nothing could be trained."""
        if k and not self._reported_no_reward:
            self._reported_no_reward = True
            first = prompt if prompt is None or len(prompt) <= 80 else prompt[:77] + "..."
            self.log(
                f"warning: all reward functions returned None for {k} of {n} completions "
                f"(first prompt: {first!r}); please ensure that at least one reward function "
                "returns a valid reward. Those rollouts are skipped and counted "
                "(rollouts_dropped_no_reward), not trained with reward 0"
            )
        self._no_reward_steps = self._no_reward_steps + 1 if n and k == n else 0
        patience = self.cfg.train.failure_patience
        if patience and self._no_reward_steps >= patience:
            raise RunFailed(
                f"all reward functions returned None for every completion for "
                f"{self._no_reward_steps} steps in a row, so nothing could be trained: make "
                "sure at least one reward function returns a number for these prompts"
            )

    def _all_too_long(self, n: int, t0: float) -> Production:
        """A step whose sampled prompts are all too long is skipped (counted); only a long
        run of such steps, i.e. a dataset whose prompts almost never fit, is an error."""
        self._empty_steps += 1
        r = self.cfg.rollout
        what = (
            f"longer than the model's {self.max_positions} positions minus "
            f"rollout.max_new_tokens={r.max_new_tokens}"
        )
        if self._empty_steps >= MAX_EMPTY_STEPS:
            raise RunFailed(
                f"every prompt sampled in {self._empty_steps} steps in a row is {what}: "
                "lower rollout.max_new_tokens or use shorter prompts"
            )
        self.log(f"warning: all {n} prompts sampled for this step are {what}; step skipped")
        return Production([], {}, 0, 0, 0, n, None, time.perf_counter() - t0)

    def _advantages(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, group means) by the configured estimator; one the learner computes
        per step (gae, with the critic) leaves 0 here."""
        a = self.cfg.algorithm
        estimate = ADVANTAGES.get(a.advantage).group
        adv = (
            torch.zeros_like(rewards)
            if estimate is None
            else estimate(rewards, group_ids, a.scale_rewards)
        )
        return adv, group_means(rewards, group_ids)

    def _to_rollouts(
        self,
        samples: list[Sample],
        prompt_texts: list[str],
        rewards: list[float | None],
        correct: list[bool],
        step: int,
        group_base: int,
    ) -> list[Rollout]:
        keep = [i for i, x in enumerate(rewards) if x is not None]
        if not keep:
            return []
        group_ids = torch.tensor([group_base + samples[i].prompt_index for i in keep])
        reward_t = torch.tensor([float(rewards[i]) for i in keep])  # type: ignore[arg-type]
        adv, means = self._advantages(reward_t, group_ids)
        out = []
        for j, i in enumerate(keep):
            s = samples[i]
            out.append(
                Rollout(
                    prompt_ids=s.prompt_ids,
                    completion_ids=s.completion_ids,
                    behaviour_logprobs=s.logprobs,
                    reward=float(reward_t[j]),
                    advantage=float(adv[j]),
                    correct=correct[i],
                    group_id=int(group_ids[j]),
                    policy_version=s.policy_version,
                    step=step,
                    completion_text=s.text,
                    prompt_text=prompt_texts[i],
                    truncated=s.truncated,
                    group_mean_reward=float(means[j]),
                )
            )
        return out


def completion_for_reward(text: str, prompt: Any) -> Any:
    """What reward functions receive, as in TRL: the text, or for a conversational prompt
    (a list of messages) the completion as one assistant message."""
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


def _std(xs: list[float]) -> float:
    """Sample standard deviation (n - 1, as TRL's nanstd); NaN below two values."""
    if len(xs) < 2:
        return math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def sampling_params(r: Any) -> SamplingParams:
    """The sampling settings of a `rollout` section (TRL's names: temperature, top_p, top_k,
    min_p, repetition_penalty; max_new_tokens is TRL's max_completion_length)."""
    return SamplingParams(
        r.temperature,
        r.top_p,
        r.max_new_tokens,
        top_k=r.top_k,
        min_p=r.min_p,
        repetition_penalty=r.repetition_penalty,
    )


def _production_stats(samples: list[Any], result: Any, correct: list[bool]) -> dict[str, float]:
    """A generation call's metrics: rewards (combined, and each function's mean and std),
    accuracy and completion lengths."""
    valid = [x for x in result.rewards if x is not None]
    ended = [s.completion_ids.numel() for s in samples if not s.truncated]
    stats = {
        "reward/mean": _mean(valid),
        "reward/std": _std(valid),
        "train/accuracy": _mean([float(x) for x in correct]),
        "completion_length": _mean([s.completion_ids.numel() for s in samples]),
        # TRL's completions/mean_terminated_length: 0 when none ended
        "completion_length_terminated": _mean(ended) if ended else 0.0,
        "truncated_frac": _mean([float(s.truncated) for s in samples]),
    }
    stats.update({f"reward/{k}": v for k, v in result.means().items()})
    stats.update(
        {
            f"reward_std/{k}": _std([x for x in v if x is not None])
            for k, v in result.per_function.items()
        }
    )
    return stats
