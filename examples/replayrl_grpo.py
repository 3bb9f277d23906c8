"""The TRL script `trl_grpo.py` ported to replayrl: experience replay on the same data and
reward. Only the import, the trainer's class name and the config block differ
(`diff examples/trl_grpo.py examples/replayrl_grpo.py`).

The `replay` preset keeps a buffer of the last N = 256 rollouts and trains each step on B = 128
of them, while generating the same R = 64 fresh ones per step as the TRL run: each rollout is
trained on about twice (replay ratio B/R = 2; arXiv 2604.08706). `replayrl presets` lists the
other presets (`grpo`: on-policy like TRL; `remix-grpo`: ReMix, arXiv 2507.06892).

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

    # config: begin
    size = {"num_generations": 8, "generation_batch_size": 64, "max_completion_length": 6}
    overrides = []  # any replayrl key, dotted
    if cli.tiny:  # 2 prompts x 4 completions per step
        size = {"num_generations": 4, "generation_batch_size": 8, "max_completion_length": 4}
        overrides = ["buffer.capacity=32", "train.batch_size=16", "eval.num_prompts=8"]
    args = ReplayConfig(
        "replay",  # N = 256 rollouts in the buffer, B = 128 trained per step
        output_dir=cli.output_dir,
        max_steps=cli.max_steps,
        learning_rate=1e-4,
        report_to="none",
        overrides=[*overrides, "train.threads=1"] if cli.tiny else overrides,
        **size,  # fresh completions per step: generation_batch_size (8 prompts x 8)
    )
    # config: end

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
