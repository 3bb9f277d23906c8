"""Callbacks with replayrl: watch every step, stop when a target accuracy is reached, and
resume later.

`on_step_end(step, metrics)` gets the step's record of metrics.jsonl; `on_evaluate(step,
metrics)` each evaluation; `on_checkpoint(step, path)` each checkpoint folder. Returning True
from any of them stops training after the current step (TRL: `control.should_training_stop`);
the run ends as usual (final evaluation, checkpoint, summary.json), and
`trainer.train(resume_from_checkpoint=True)` continues it. A plain function `f(step, metrics)`
in `callbacks=[...]` is an `on_step_end`.

Run: python examples/callbacks.py [--target 0.9] [--tiny]
"""

import argparse

from replayrl import ReplayCallback, ReplayConfig, ReplayTrainer


class StopAtAccuracy(ReplayCallback):
    """Stop as soon as an evaluation during training reaches `target`."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.stopped_at: int | None = None

    def on_evaluate(self, step, metrics):
        if step > 0 and metrics["eval/accuracy"] >= self.target:  # step 0: before training
            self.stopped_at = step
            print(f"eval accuracy {metrics['eval/accuracy']:.3f} >= {self.target}: stopping")
            return True
        return False

    def on_checkpoint(self, step, path):
        print(f"checkpoint at step {step}: {path}")


def print_rewards(step, metrics):
    """A plain function: called after every step."""
    print(f"step {step}: reward {metrics['reward/mean']:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", type=float, default=0.9, help="eval accuracy to stop at")
    p.add_argument("--output-dir", default="runs/example-callbacks")
    p.add_argument("--max-steps", type=int, default=80)
    p.add_argument("--tiny", action="store_true", help="a tiny run (tests)")
    cli = p.parse_args()
    # a 1-layer model, 2 prompts x 4 completions per step, 8 eval prompts (seconds on a CPU)
    tiny = (
        "model.tiny.num_layers=1 model.tiny.hidden_size=32 model.tiny.num_heads=2 "
        "model.tiny.intermediate_size=64 model.warmstart.steps=5 model.warmstart.mistake_steps=0 "
        "rollout.prompts_per_step=2 rollout.num_generations=4 rollout.max_new_tokens=4 "
        "eval.num_prompts=8 train.threads=1"
    ).split()
    stopper = StopAtAccuracy(cli.target)
    # the demo task (2-digit addition) and model from the `grpo` preset; evaluate every 5 steps
    trainer = ReplayTrainer(
        args=ReplayConfig(
            "grpo",
            output_dir=cli.output_dir,
            max_steps=cli.max_steps,
            eval_steps=1 if cli.tiny else 5,
            disable_tqdm=True,
            overrides=tiny if cli.tiny else [],
        ),
        callbacks=[stopper, print_rewards],
    )
    summary = trainer.train()
    if stopper.stopped_at is not None:
        print(f"stopped at step {summary['steps']} of {cli.max_steps}")
        # later (or now): the run continues from its last checkpoint
        # trainer.train(resume_from_checkpoint=True)
    else:
        print(f"target not reached in {summary['steps']} steps")


if __name__ == "__main__":
    main()
