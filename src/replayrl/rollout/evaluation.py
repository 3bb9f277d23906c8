"""Held-out evaluation: greedy pass@1 and, optionally, pass@k at a sampling temperature.

`evaluate_policy` is the one evaluation every caller uses (the training session, the Python
API's `evaluate()`, `replayrl eval` and the TRL peer in benchmarks), so that they measure the
same thing from the same config: the first `eval.num_prompts` held-out rows (`held_out_rows`),
`rollout.max_new_tokens`, `eval.pass_k` at `eval.temperature`.
"""

from __future__ import annotations

from collections.abc import Callable
from math import comb
from typing import Any

from replayrl.config.schema import Config
from replayrl.rollout.generation import Generator, SamplingParams
from replayrl.rollout.prompts import prompt_fits
from replayrl.rollout.tasks import Task
from replayrl.rollout.tasks.base import Row


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k), n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    generator: Generator,
    task: Task,
    rows: list[Row],
    max_new_tokens: int,
    pass_k: int = 0,
    temperature: float = 1.0,
    render: Callable[[Any], str] | None = None,
    completions: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Accuracy of greedy decoding (pass@1) and pass@k with k samples per prompt.

    `render` turns a row's prompt into the text generated from (chat template, see
    `replayrl.rollout.prompts`); None sends the prompt as it is. `completions`: a list that
    receives each row's greedy completion ({prompt, completion, answer, correct}).
    """
    prompts = [render(r["prompt"]) if render else r["prompt"] for r in rows]
    greedy = generator.generate(
        prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    )
    correct = [task.is_correct(s.text, rows[s.prompt_index]) for s in greedy]
    if completions is not None:
        completions.extend(
            {
                "prompt": prompts[s.prompt_index],
                "completion": s.text,
                "answer": rows[s.prompt_index].get("answer"),
                "correct": ok,
            }
            for s, ok in zip(greedy, correct, strict=True)
        )
    out = {
        "eval/accuracy": sum(correct) / len(rows),
        "eval/completion_length": sum(s.completion_ids.numel() for s in greedy) / len(greedy),
    }
    if pass_k > 1:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
        samples = generator.generate(prompts, pass_k, params)
        hits = [0] * len(rows)
        for s in samples:
            hits[s.prompt_index] += task.is_correct(s.text, rows[s.prompt_index])
        out[f"eval/pass@{pass_k}"] = sum(pass_at_k(pass_k, c, pass_k) for c in hits) / len(rows)
    return out


def rows_that_fit(
    rows: list[Row],
    render: Callable[[Any], str],
    tokenizer: Any,
    max_positions: int | None,
    max_new_tokens: int,
) -> tuple[list[Row], int]:
    """(the rows whose rendered prompt fits the model with `max_new_tokens`, how many do
    not): evaluation skips and counts them as training does, so that accuracy is over the
    prompts the model could answer, never over positions past its table."""
    kept = [
        r
        for r in rows
        if prompt_fits(tokenizer, render(r["prompt"]), max_positions, max_new_tokens)
    ]
    return kept, len(rows) - len(kept)


def too_long_note(skipped: int, total: int, max_positions: int | None, max_new_tokens: int) -> str:
    """What a log line says about the prompts `rows_that_fit` skipped."""
    return (
        f"{skipped} of {total} eval prompts are longer than the model's {max_positions} "
        f"positions minus rollout.max_new_tokens={max_new_tokens}: skipped and counted, not scored"
    )


def held_out_rows(cfg: Config, task: Task) -> list[Row]:
    """The rows a run evaluates on: the task's eval split, its first `eval.num_prompts`."""
    rows = task.eval_rows()
    return rows[: cfg.eval.num_prompts] if cfg.eval.num_prompts else rows


def evaluate_policy(
    cfg: Config,
    generator: Generator,
    task: Task,
    rows: list[Row],
    render: Callable[[Any], str] | None = None,
    completions: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """`evaluate` with the config's settings (`rollout.max_new_tokens`, `eval.pass_k`,
    `eval.temperature`): the evaluation of a run, the API, the CLI and the TRL peer."""
    e = cfg.eval
    return evaluate(
        generator,
        task,
        rows,
        cfg.rollout.max_new_tokens,
        pass_k=e.pass_k,
        temperature=e.temperature,
        render=render,
        completions=completions,
    )
