"""GRPO with TRL: the script that `replayrl_grpo.py` ports to replayrl.

The two files differ only in the import, the trainer's class name and the config's class name
(`diff examples/trl_grpo.py examples/replayrl_grpo.py`). Needs `pip install trl`.

    python examples/trl_grpo.py --model PATH_OR_HUB_ID
    python examples/trl_grpo.py --model PATH --tiny     # a few seconds on a CPU (the tests)
"""

import argparse
import os
import random

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


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
    args = GRPOConfig(
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

    trainer = GRPOTrainer(
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
