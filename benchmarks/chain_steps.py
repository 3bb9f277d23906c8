"""Where a chain warm start goes wrong: per-step accuracy of its own written steps.

    PYTHONPATH=src python benchmarks/chain_steps.py [KEY=VALUE ...]

Builds (or reuses, cached) the tiny model's warm start for configs/reasoning-chain.yaml with
the given overrides, decodes the 200 held-out prompts greedily and 8 samples each at
temperature 1, and prints final accuracy, median completion length (tokens, EOS included)
and, for every step the model wrote (`a+b=v`), whether v is right for the model's own a and
b, by kind: operation, operand of 1 or 2 digits, with or without a carry/borrow.
Example (the old 2-digit chain; model.warmstart.mistake_steps=0: SFT on correct chains only):
    python benchmarks/chain_steps.py task.reasoning.digits=2 task.reasoning.terms=5 \
        model.warmstart.mistake_steps=0
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from replayrl.config.schema import load_config
from replayrl.rollout.tasks import task_from_config
from replayrl.run.warmstart import ensure_warmstart

STEP = re.compile(r"(\d+)([+-])(\d+)=(\d+)")


def step_kind(a: int, op: str, b: int) -> tuple[str, str, str]:
    carry = (a % 10 + b % 10 >= 10) if op == "+" else (a % 10 < b % 10)
    return (op, "2d" if b >= 10 else "1d", "carry" if carry else "nocarry")


def report(task, tok, model, rows, max_new: int, samples: int) -> None:
    batch = [r for r in rows for _ in range(samples or 1)]
    prompts = [r["prompt"] for r in batch]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    extra = {"temperature": 1.0, "top_k": 0} if samples else {}
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new,
            do_sample=bool(samples),
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **extra,
        )
    new = out[:, enc["input_ids"].shape[1] :]
    texts = [t.replace(" ", "") for t in tok.batch_decode(new, skip_special_tokens=True)]
    total, good = collections.Counter(), collections.Counter()
    lengths, correct = [], 0
    for row, text in zip(batch, texts, strict=True):
        lengths.append(len(tok(text, add_special_tokens=False)["input_ids"]) + 1)
        correct += task.is_correct(text, row)
        for a, op, b, v in STEP.findall(text):
            a, b, v = int(a), int(b), int(v)
            kind = step_kind(a, op, b)
            total[kind] += 1
            good[kind] += v == (a + b if op == "+" else a - b)
    lengths.sort()
    name = f"sampled x{samples} (T=1)" if samples else "greedy"
    median = lengths[len(lengths) // 2]
    print(f"{name}: accuracy {correct / len(batch):.3f}, median length {median}")
    for kind in sorted(total):
        share = good[kind] / total[kind]
        print(f"  step {' '.join(kind)}: {good[kind]}/{total[kind]} = {share:.3f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides of reasoning-chain.yaml")
    overrides = parser.parse_args(argv).overrides
    torch.set_num_threads(1)
    cfg = load_config("configs/reasoning-chain.yaml", overrides)
    path = ensure_warmstart(cfg.model, cfg.task)
    task = task_from_config(cfg.task)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = task.eval_rows()
    torch.manual_seed(0)
    for samples in (0, 8):
        report(task, tok, model, rows, cfg.rollout.max_new_tokens, samples)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
