"""Procedurally generated verifiable tasks from the reasoning-gym package (nothing downloaded).

`task.name: reasoning_gym` with `task.reasoning_gym.datasets` (one or more dataset names, e.g.
`[basic_arithmetic, chain_sum]`), `size` (train items per dataset), per-dataset keyword
arguments (`config: {chain_sum: {min_terms: 2}}`) and sampling weights. The training items
come from seed `task.seed`, the held-out split (`task.eval_size` items, spread over the
datasets) from a different seed, and a training item whose question is also in the held-out
split is never served (counted in `skipped_eval_duplicates`).

Prompts are messages (reasoning-gym's default system prompt, which asks for the answer in
`<answer>` tags, then the question), rendered by the tokenizer's chat template like any
conversational dataset. The reward is the dataset's own scorer (`rewards: [{name:
reasoning_gym}]`, rewards/reasoning_gym.py); `is_correct` means a full score.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from replayrl.config.section import Section
from replayrl.rollout.rewards.reasoning_gym import import_reasoning_gym, score_completion
from replayrl.rollout.tasks.base import Row

EVAL_SEED_OFFSET = 1_000_003  # the held-out split's seed: task.seed + this


class ReasoningGymConfig(Section):
    """task.name=reasoning_gym: generated tasks of the reasoning-gym package, under
    `task.reasoning_gym`."""

    datasets: list[str] = []  # dataset names, e.g. [basic_arithmetic, chain_sum]
    size: int = Field(10_000, ge=1)  # training items per dataset (seed: task.seed)
    config: dict[str, dict[str, Any]] = {}  # per-dataset keyword arguments
    weights: dict[str, float] = {}  # sampling weight per dataset (default 1 each)


def _system_prompt() -> str:
    rg = import_reasoning_gym()
    return rg.utils.SYSTEM_PROMPTS["default"]


class ReasoningGymTask:
    name = "reasoning_gym"

    def __init__(
        self,
        datasets: Sequence[str],
        *,
        size: int = 10_000,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        weights: Mapping[str, float] | None = None,
        eval_size: int = 200,
        seed: int = 0,
        system_prompt: str | None = None,
    ) -> None:
        rg = import_reasoning_gym()
        if not datasets:
            raise ValueError("task.reasoning_gym.datasets must name at least one dataset")
        known = set(rg.factory.DATASETS)
        unknown = [d for d in datasets if d not in known]
        if unknown:
            raise ValueError(
                f"task.reasoning_gym.datasets: unknown {unknown} (reasoning-gym has e.g. "
                f"{', '.join(sorted(known)[:12])}, ...)"
            )
        config = dict(config or {})
        extra = set(config) - set(datasets)
        if extra:
            raise ValueError(f"task.reasoning_gym.config names datasets not in use: {extra}")
        weights = dict(weights or {})
        if set(weights) - set(datasets) or any(w < 0 for w in weights.values()):
            raise ValueError(f"task.reasoning_gym.weights: bad {weights} for {list(datasets)}")
        self.names = list(datasets)
        self.size = size
        self.system_prompt = system_prompt if system_prompt is not None else _system_prompt()
        self._configs = {n: json.dumps(dict(config.get(n, {})), sort_keys=True) for n in datasets}
        w = np.array([weights.get(n, 1.0) for n in datasets], dtype=float)
        if w.sum() <= 0:
            raise ValueError("task.reasoning_gym.weights: at least one must be positive")
        self._p = w / w.sum()
        self._train = {}
        for n in datasets:
            try:
                self._train[n] = rg.create_dataset(n, size=size, seed=seed, **config.get(n, {}))
            except (TypeError, ValueError, AssertionError) as exc:
                raise ValueError(
                    f"task.reasoning_gym: dataset {n!r} with config {config.get(n, {})}: {exc}"
                ) from exc
        # eval: eval_size items spread over the datasets, from another seed
        per = [
            eval_size // len(datasets) + (i < eval_size % len(datasets))
            for i in range(len(datasets))
        ]
        self._eval: list[Row] = []
        for n, k in zip(datasets, per, strict=True):
            if k:
                ds = rg.create_dataset(n, size=k, seed=seed + EVAL_SEED_OFFSET, **config.get(n, {}))
                self._eval.extend(self._row(n, ds[i]) for i in range(k))
        self._eval_questions = {r["rg_entry"]["question"] for r in self._eval}
        self.skipped_eval_duplicates = 0

    def _row(self, name: str, entry: dict) -> Row:
        return {
            "prompt": [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": entry["question"]},
            ],
            "answer": str(entry["answer"]),
            "rg_dataset": name,
            "rg_config": self._configs[name],
            "rg_entry": entry,
        }

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Row]:
        rows: list[Row] = []
        misses = 0
        while len(rows) < n:
            name = self.names[int(rng.choice(len(self.names), p=self._p))]
            entry = self._train[name][int(rng.integers(0, self.size))]
            if entry["question"] in self._eval_questions:
                self.skipped_eval_duplicates += 1
                misses += 1
                if misses > 100 * n + 1000:
                    raise ValueError(
                        "task.reasoning_gym: nearly every training item is also in the held-out "
                        "split (a tiny problem space): use harder datasets or a smaller eval_size"
                    )
                continue
            rows.append(self._row(name, entry))
        return rows

    def eval_rows(self) -> list[Row]:
        return list(self._eval)

    def score(self, completion: str, row: Row) -> float:
        return score_completion(completion, row["rg_dataset"], row["rg_config"], row["rg_entry"])

    def is_correct(self, completion: str, row: Row) -> bool:
        return self.score(completion, row) >= 1.0

    def sft_completion(self, row: Row, rng: np.random.Generator, error_rate: float) -> str:
        """The teacher's reply for a supervised warm-up: the answer in reasoning-gym's tags, or
        with probability `error_rate` a near miss (an integer off by 1 or 10, as a slip of a
        carry; otherwise another training item's answer of the same dataset)."""
        answer = row["answer"]
        if error_rate > 0 and rng.random() < error_rate:
            answer = self._near_miss(answer, row["rg_dataset"], rng)
        return f"<answer>{answer}</answer>"

    def _near_miss(self, answer: str, dataset: str, rng: np.random.Generator) -> str:
        try:
            value = int(answer)
        except ValueError:
            for _ in range(20):
                other = str(self._train[dataset][int(rng.integers(0, self.size))]["answer"])
                if other != answer:
                    return other
            return answer  # a dataset whose answers are all the same: nothing else to say
        return str(value + int(rng.choice([-10, -1, 1, 10])))

    def corpus(self) -> list[str]:
        return [r["rg_entry"]["question"] + " " + r["answer"] for r in self._eval]
