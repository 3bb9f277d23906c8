"""The two halves of a step that every loop shares: generate fresh rollouts with the current
weights, and train the learner on a batch. The synchronous loop calls both each step; the
asynchronous learner calls `learn` when a batch is ready (generators produce elsewhere); the
`auto` design's warm-up calls `produce_fresh`. Each takes the parts of a run it touches, not
the session that holds them, so a loop shows what a step reads and changes."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from replayrl.config.schema import Config
from replayrl.data.buffer import batch_stats
from replayrl.data.rollout_record import Rollout
from replayrl.learner.critic import policy_frozen
from replayrl.learner.learner import Learner
from replayrl.methods.base import GROUP_STRIDE
from replayrl.methods.buffer import BatchSource
from replayrl.models.loading import unwrap_model
from replayrl.rollout.generation.base import WeightOwner
from replayrl.rollout.producer import RolloutProducer
from replayrl.run.completions import CompletionsLog
from replayrl.run.session import reflection_rate
from replayrl.run.state import Counters

# the session's no-silent-non-training guard: (batch, train metrics, 1-based step) -> None
CheckTraining = Callable[[list[Rollout], dict[str, float], int], None]


def produce_fresh(
    producer: RolloutProducer, source: BatchSource | None, counters: Counters, version: int
) -> tuple[list[Rollout], dict[str, float]]:
    """Generate with the weights of `version`, score, and turn samples into rollouts with
    group advantages (the producer); `counters` account for them. `source`: the run's batch
    source (None during the `auto` warm-up, which has none yet)."""
    c = counters
    # a method may ask for fewer new prompts this step (ReMix's fixed composition while mixing)
    n = source.prompts_this_step() if source is not None else None
    p = producer.produce(version, c.step, c.step * GROUP_STRIDE, num_prompts=n)
    c.account(p)
    return p.rollouts, {
        **p.stats,
        "rollouts/dropped_reward_error": float(c.rollouts_dropped_reward_error),
        "rollouts/dropped_reward_timeout": float(c.rollouts_dropped_reward_timeout),
        "rollouts/dropped_no_reward": float(c.rollouts_dropped_no_reward),
    }


def learn(
    learner: Learner,
    counters: Counters,
    batch: list[Rollout],
    epochs: int,
    fresh: list[Rollout],
    stats: dict[str, float],
    *,
    cfg: Config,
    shuffle_rng: np.random.Generator,
    check_training: CheckTraining,
    completions: CompletionsLog,
    engine: WeightOwner | None,
) -> float:
    """One learner step on `batch`, `epochs` passes (`fresh`: this step's new rollouts, for
    text metrics); returns its seconds. The counters' step advances; an `engine` with weights
    of its own (vLLM) gets the new ones. `stats` receives the step's metrics."""
    c = counters
    version = learner.version
    t1 = time.perf_counter()
    if batch:
        stats.update({f"batch/{k}": v for k, v in batch_stats(batch, version).items()})
        train_metrics = learner.train_step(
            batch,
            shuffle_rng,
            step=c.step + 1,  # t in the paper's lambda(t): 1-based update count
            epochs=epochs,
            policy_frozen=policy_frozen(
                c.step + 1, cfg.critic.warmup_steps, learner.critic is not None
            ),
        )
        stats.update({f"train/{k}": v for k, v in train_metrics.items()})
        check_training(batch, train_metrics, c.step + 1)  # no silent non-training
        stats["reflection_rate"] = reflection_rate(
            [r.completion_text for r in fresh], cfg.logging.reflection_words
        )
    else:
        learner.version += 1  # nothing to learn from (all dropped): still a new step
    t_train = time.perf_counter() - t1
    c.add_trained(sum(r.completion_ids.numel() for r in batch), len(batch), epochs, t_train)
    completions.log(c.step, fresh, batch, version)  # a few readable samples, every k steps
    stats["time/training_s"] = t_train
    push_engine_weights(engine, learner)
    return t_train


def push_engine_weights(engine: WeightOwner | None, learner: Learner) -> None:
    """The learner's weights into a generator that owns a copy of its own (`engine`: its
    backend's spec says so, vLLM); one that generates with the learner's model needs nothing."""
    if engine is not None:
        engine.load_weights(unwrap_model(learner.model).named_parameters(), learner.version)
