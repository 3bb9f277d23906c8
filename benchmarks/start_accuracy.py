"""Start accuracy of a model on candidate reasoning-gym tasks (to pick a task where the
start policy is neither hopeless nor saturated, greedy pass@1 between 10% and 60%).

    PYTHONPATH=src python benchmarks/start_accuracy.py --out benchmarks/results/smollm2/start.jsonl

Everything goes through the project's own path: `ReasoningGymTask` (seeded held-out split),
the tokenizer's chat template (`PromptRenderer`), `HFGenerator` (fast path) and the task's
reasoning-gym scorer. Per candidate: greedy pass@1 over the held-out prompts, then
`--samples` completions per prompt at temperature 1 (sampled pass@1 = mean correctness),
plus the mean score (partial credit) and the share of completions with an <answer> tag.
One JSON line per (dataset, mode) is appended to --out as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from replayrl.models.loading import resolve_model_path
from replayrl.rollout.generation import SamplingParams
from replayrl.rollout.generation.hf import HFGenerator
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.rewards.reasoning_gym import extract_tagged_answer
from replayrl.rollout.tasks.reasoning_gym import ReasoningGymTask

# easy configurations of small-number / short-string datasets
CANDIDATES: dict[str, dict] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "number_sorting": {
        "min_numbers": 3,
        "max_numbers": 4,
        "min_decimals": 0,
        "max_decimals": 0,
        "min_value": 0,
        "max_value": 99,
    },
    "count_bits": {"min_n": 1, "max_n": 63},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
    "word_sequence_reversal": {"min_words": 3, "max_words": 4},
    "word_sorting": {"min_words": 3, "max_words": 4, "min_word_length": 3, "max_word_length": 6},
    "simple_equations": {
        "min_terms": 2,
        "max_terms": 2,
        "max_value": 10,
        "operators": ["+", "-"],
        "operators_weights": [0.5, 0.5],
    },
    "gcd": {"min_value": 1, "max_value": 20},
}


def measure(
    gen, task, render, samples: int, max_new_tokens: int, greedy: bool, prefix: str = ""
) -> dict:
    """`prefix` is appended to the rendered prompt (the assistant's reply starts with it) and
    put back in front of the completion before scoring."""
    rows = task.eval_rows()
    prompts = [render(r["prompt"]) + prefix for r in rows]
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, greedy=greedy)
    start = time.perf_counter()
    out = gen.generate(prompts, 1 if greedy else samples, params)
    seconds = time.perf_counter() - start
    scores = [task.score(prefix + s.text, rows[s.prompt_index]) for s in out]
    return {
        "pass@1": sum(sc >= 1.0 for sc in scores) / len(out),
        "mean_score": sum(scores) / len(out),
        "answer_tag": sum(extract_tagged_answer(prefix + s.text) is not None for s in out)
        / len(out),
        "truncated": sum(s.truncated for s in out) / len(out),
        "completion_length": sum(s.completion_ids.numel() for s in out) / len(out),
        "completions": len(out),
        "seconds": round(seconds, 1),
        "example": out[0].text[:300],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--datasets", nargs="*", default=list(CANDIDATES))
    ap.add_argument("--eval-size", type=int, default=40)
    ap.add_argument("--samples", type=int, default=1, help="sampled completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", nargs="*", default=["greedy", "sampled"])
    ap.add_argument(
        "--system-prompt",
        default=None,
        help="task.system_prompt (default: reasoning-gym's own, which asks for <answer> tags)",
    )
    ap.add_argument(
        "--answer-prefix",
        default="",
        help="text the assistant's reply starts with (e.g. '<answer>'), scored with it",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
    gen = HFGenerator(model, tok, batch_size=64)
    render = PromptRenderer(tok, use_chat_template=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tasks = {
        n: ReasoningGymTask(
            [n],
            size=1000,
            config={n: CANDIDATES.get(n, {})},
            eval_size=args.eval_size,
            system_prompt=args.system_prompt,
        )
        for n in args.datasets
    }
    for mode in args.modes:  # greedy for every candidate first: the cheaper, decisive figure
        for name, task in tasks.items():
            res = measure(
                gen,
                task,
                render,
                args.samples,
                args.max_new_tokens,
                mode == "greedy",
                args.answer_prefix,
            )
            rec = {"dataset": name, "config": CANDIDATES.get(name, {}), "mode": mode, **res}
            rec.update(max_new_tokens=args.max_new_tokens, dtype=args.dtype, model=args.model)
            rec.update(system_prompt=args.system_prompt, eval_size=args.eval_size)
            rec.update(answer_prefix=args.answer_prefix)
            with args.out.open("a") as f:  # one line at a time: a partial run keeps its lines
                f.write(json.dumps(rec) + "\n")
            print(f"{name:24s} {mode:8s} pass@1 {res['pass@1']:.3f} ({res['seconds']} s)")


if __name__ == "__main__":
    main()
