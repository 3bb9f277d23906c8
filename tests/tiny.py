"""Shared overrides for end-to-end runs on a 1-layer, 32-wide Llama (fast on CPU)."""

from __future__ import annotations

from pathlib import Path

from replayrl.config.schema import Config, load_config

TINY_MODEL = [
    "model.tiny.num_layers=1",
    "model.tiny.hidden_size=32",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.warmstart.steps=5",
    "model.warmstart.mistake_steps=0",
]
# R = 2 prompts x 4 completions = 8 rollouts per step; quick evals; no TensorBoard or bar
TINY_RUN = [
    *TINY_MODEL,
    "rollout.prompts_per_step=2",
    "rollout.num_generations=4",
    "rollout.max_new_tokens=4",
    "eval.num_prompts=8",
    "eval.every=0",
    "logging.tensorboard=false",
    "logging.progress=false",
]


def tiny_config(run_dir: Path, *extra: str, config: str | None = None) -> Config:
    """A tiny run writing under `run_dir`; `extra` overrides come last."""
    return load_config(config, [*TINY_RUN, f"logging.run_dir={run_dir}", *extra])
