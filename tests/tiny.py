"""Shared overrides for end-to-end runs on a 1-layer, 32-wide Llama (fast on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def crash_and_resume(
    tmp_path: Path,
    monkeypatch: Any,
    preset: str,
    overrides: list[str],
    steps: int = 4,
    before_resume: Any = None,
) -> tuple[dict, dict, list[dict], list[dict]]:
    """Run `preset` through the Python API whole, then again crashing after step 3's update
    (before its checkpoint) and resumed. Returns (whole summary, resumed summary, the whole
    run's per-step metrics, the crashed-and-resumed run's), the metrics without timings.
    `before_resume(crashed_run_dir)`: a look at the crashed run before it resumes."""
    import pytest

    from replayrl.api.trainer import ReplayConfig, ReplayTrainer
    from replayrl.run.metrics import read_metrics
    from replayrl.run.session import Session
    from replayrl.run.start import resume

    def trainer(name: str) -> ReplayTrainer:
        # steps, not TRL's max_steps (optimizer updates: epochs or mini-batches in
        # `overrides` would make them fewer steps)
        args = ReplayConfig(
            preset, output_dir=str(tmp_path / name), train__steps=steps, overrides=overrides
        )
        return ReplayTrainer(args=args, log=lambda _: None)

    whole = trainer("whole").train()
    original = Session.checkpoint

    def crash_at_step_3(self: Session) -> Path:
        if self.counters.step == 3:
            raise RuntimeError("simulated crash")
        return original(self)

    monkeypatch.setattr(Session, "checkpoint", crash_at_step_3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer("crash").train()
    monkeypatch.setattr(Session, "checkpoint", original)
    if before_resume is not None:
        before_resume(tmp_path / "crash")
    resumed = resume(tmp_path / "crash", log=lambda _: None)

    def per_step(name: str) -> list[dict]:
        return [
            {k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_seconds"}
            for r in read_metrics(tmp_path / name / "metrics.jsonl")
            if "reward/mean" in r
        ]

    return whole, resumed, per_step("whole"), per_step("crash")


def produce_fresh_of(s: Any) -> tuple[list[Any], dict[str, float]]:
    """`loops.steps.produce_fresh` on a session's parts, as the loops call it."""
    from replayrl.run.loops.steps import produce_fresh

    return produce_fresh(s.producer, s.source, s.counters, s.learner.version)


def learn_on(s: Any, *step: Any) -> float:
    """`loops.steps.learn(batch, epochs, fresh, stats)` on a session's parts."""
    from replayrl.run.loops.steps import learn

    parts = {
        "cfg": s.cfg,
        "shuffle_rng": s.parts.shuffle_rng,
        "check_training": s.check_training,
        "completions": s.completions,
        "engine": s.engine,
    }
    return learn(s.learner, s.counters, *step, **parts)


def bf16_sampled_rollouts(
    model: Any, tokenizer: Any, max_new_tokens: int = 6, seed: int = 5
) -> list[Any]:
    """12 rollouts (3 prompts x 4) of version 0 sampled in bf16 from `model` (so an fp32
    learner's log pi_old differs from the sampler's), with made-up rewards and advantages."""
    import torch

    from replayrl.rollout.generation import HFGenerator, SamplingParams

    gen = HFGenerator(model, tokenizer, 16, dtype=torch.bfloat16)
    torch.manual_seed(seed)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, params)
    return as_rollouts(samples, [1.0 if i % 3 else -1.0 for i in range(len(samples))])


def as_rollouts(samples: list[Any], advantages: list[float]) -> list[Any]:
    """Version-0 rollouts of generator samples, with made-up rewards (alternating 0 / 1)
    and the given advantages."""
    from replayrl.data.rollout_record import Rollout

    return [
        Rollout(
            prompt_ids=s.prompt_ids,
            completion_ids=s.completion_ids,
            behaviour_logprobs=s.logprobs,
            reward=float(i % 2),
            advantage=a,
            correct=False,
            group_id=s.prompt_index,
            policy_version=0,
            step=0,
        )
        for i, (s, a) in enumerate(zip(samples, advantages, strict=True))
    ]
