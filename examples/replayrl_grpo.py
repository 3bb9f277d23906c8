"""The TRL script `trl_grpo.py` ported to replayrl: only the import, the trainer's class name and
the config's class name differ (`diff examples/trl_grpo.py examples/replayrl_grpo.py`).

With TRL's arguments and no preset, replayrl trains as TRL does: the same learning rate
schedule (linear decay), completions per step, loss normalisation, no evaluation and plain
prompts sent as they are; what it cannot match it says once at start. Reusing rollouts is one
preset name away: `ReplayConfig("replay", ...)` keeps a buffer and trains each step on
rollouts sampled from it (experience replay, arXiv 2604.08706; `buffer__capacity` N and
`train__batch_size` B set the staleness horizon N/R and replay ratio B/R), and
`ReplayConfig("remix-grpo", ...)` runs ReMix (arXiv 2507.06892). `replayrl presets` lists them.

    python examples/replayrl_grpo.py --model PATH_OR_PREPARED_NAME
    python examples/replayrl_grpo.py --model PATH --tiny     # a few seconds on a CPU (the tests)
"""

import argparse
import os
import random

from datasets import Dataset
from replayrl import ReplayConfig, ReplayTrainer


def make_dataset(n: int, seed: int) -> Dataset:
    """Two-digit additions: a prompt and the answer the reward checks."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return Dataset.from_list(rows)


def correct_sum(completions, answer, **kwargs):
    """1.0 when the completion is the sum, else 0.0 (TRL's reward signature)."""
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="a causal LM folder or hub id")
    p.add_argument("--output-dir", default="runs/example")
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--tiny", action="store_true", help="a tiny run (tests)")
    cli = p.parse_args()
    train_dataset, eval_dataset = make_dataset(2000, seed=0), make_dataset(200, seed=1)

    size = {"num_generations": 8, "per_device_train_batch_size": 64, "max_completion_length": 6}
    if cli.tiny:  # 2 prompts x 4 completions per step
        size = {"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 4}
    args = ReplayConfig(
        output_dir=cli.output_dir,
        max_steps=cli.max_steps,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        **size,  # completions per step: per_device_train_batch_size (8 prompts x 8)
    )

    trainer = ReplayTrainer(
        model=cli.model,
        reward_funcs=[correct_sum],
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    trainer.train()
    trainer.save_model(os.path.join(cli.output_dir, "final"))
    print(f"trained {trainer.state.global_step} steps -> {cli.output_dir}")


if __name__ == "__main__":
    main()
