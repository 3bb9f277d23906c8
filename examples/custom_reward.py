"""A custom reward with replayrl: your own function (TRL's signature), weighted beside a
built-in one, on rows with an extra column, trained with the ReMix preset.

A reward function gets the prompts, the completions and every dataset column as keyword lists
(here `answer` and `carry`) and returns one float per completion, or None where it does not
apply. A function that raises, or returns NaN, drops only the rollouts concerned (counted in
the `rollouts/dropped_reward_error` metric), not the run.

The same run from the command line, with the rows in a JSONL file (the reward as a file path
and function name):

    replayrl train --config remix-grpo model.path=PATH task.name=dataset \\
        task.dataset.path=rows.jsonl \\
        "rewards=[{name: 'examples/custom_reward.py:digit_credit'},
                  {name: digits_format, weight: 0.2}]"

Run: python examples/custom_reward.py [--model PATH] [--tiny]
(no --model: the built-in tiny demo model, which knows only digits and + - =)
"""

import argparse
import random

from replayrl import ReplayConfig, ReplayTrainer


def digit_credit(prompts, completions, answer, carry, **kwargs):
    """Partial credit: the share of the answer's digits in the right place (right-aligned),
    for sums with a carry only (None elsewhere: the other reward decides)."""
    out = []
    for completion, target, has_carry in zip(completions, answer, carry, strict=True):
        if not has_carry:
            out.append(None)
            continue
        got = completion.strip()[::-1]
        want = target[::-1]
        hits = sum(g == w for g, w in zip(got, want, strict=False))
        out.append(hits / max(len(want), len(got), 1))
    return out


def make_rows(n: int, seed: int) -> list[dict]:
    """Rows as a list of dicts, with an extra column the reward reads."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b), "carry": a % 10 + b % 10 > 9})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None, help="a causal LM folder (default: the tiny model)")
    p.add_argument("--output-dir", default="runs/example-custom-reward")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--tiny", action="store_true", help="a tiny run (tests)")
    cli = p.parse_args()
    # a 1-layer model, 2 prompts x 4 completions per step, 8 eval prompts (seconds on a CPU)
    tiny = (
        "model.tiny.num_layers=1 model.tiny.hidden_size=32 model.tiny.num_heads=2 "
        "model.tiny.intermediate_size=64 model.warmstart.steps=5 model.warmstart.mistake_steps=0 "
        "rollout.prompts_per_step=2 rollout.num_generations=4 rollout.max_new_tokens=4 "
        "eval.num_prompts=8 train.threads=1 method.remix.reincarnation_step=1 "
        "logging.progress=false"
    ).split()
    trainer = ReplayTrainer(
        model=cli.model,
        # a callable and a built-in reward by name; weights in the config, as in TRL
        reward_funcs=[digit_credit, "digits_format"],
        args=ReplayConfig(
            "remix-grpo",
            output_dir=cli.output_dir,
            # steps, not TRL's max_steps (optimizer updates): a ReMix step takes method.remix.utd
            # passes before reincarnation and method.remix.utd_after after it
            train__steps=cli.steps,
            reward_weights=[1.0, 0.2],
            overrides=tiny if cli.tiny else [],
        ),
        train_dataset=make_rows(1000, seed=0),
        eval_dataset=make_rows(100, seed=1),
    )
    summary = trainer.train()
    last = trainer.state.log_history[-1]
    print(
        f"trained {summary['steps']} steps; last step: reward/digit_credit "
        f"{last.get('reward/digit_credit')}, reward/digits_format "
        f"{last.get('reward/digits_format')}; final eval accuracy "
        f"{summary['final_eval_accuracy']:.3f}"
    )


if __name__ == "__main__":
    main()
