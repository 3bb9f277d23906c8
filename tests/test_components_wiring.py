"""The batch-source registry builds AR3PO's and ExGRPO's sources from the config and the run's
producer and learner: every argument reaches the source (wiring found by mutation testing: a
dropped `scale_rewards` or a producer argument passed as None trained silently)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from replayrl.config.schema import load_config
from replayrl.data.buffer import OnPolicyQueue
from replayrl.data.buffer.base import make_rng
from replayrl.methods.ar3po import Ar3poSource
from replayrl.methods.exgrpo import ExgrpoSource
from replayrl.run.components import build_batch_source


class RecordingProducer:
    """Stands in for RolloutProducer: records every produce call and sample_train call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.samples: list[tuple] = []
        self.last_rows = {3: {"prompt": "1+2=", "answer": "3"}}
        self.rows_by_text = {"again": {"prompt": "again"}}
        self.prompt_rng = object()
        self.task = SimpleNamespace(sample_train=self._sample_train)

    def produce(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return [], {}

    def sample_prompts(self, n):  # as RolloutProducer: from its task, with its own stream
        return self.task.sample_train(n, self.prompt_rng)

    def _sample_train(self, n, rng):
        self.samples.append((n, rng))
        return [{"prompt": f"q{i}"} for i in range(n)]


def test_build_ar3po_passes_config_and_every_produce_argument():
    cfg = load_config(
        "ar3po",
        [
            "rollout.num_generations=3",
            "rollout.prompts_per_step=5",
            "train.epochs=2",
            "method.ar3po.store_per_prompt=2",
            "method.ar3po.store_prompts=7",
        ],
    )
    producer = RecordingProducer()
    src = build_batch_source(cfg, OnPolicyQueue(), producer)  # type: ignore[arg-type]
    assert isinstance(src, Ar3poSource)
    assert (src.per_round, src.prompts_per_call, src.epochs) == (3, 5, 2)
    assert src.scale_rewards is True and src.ar is cfg.method.ar3po
    assert (src.store.per_prompt, src.store.max_prompts) == (2, 7)
    src.produce(11, 12, 13, ["again"], 4)
    assert producer.calls == [((11, 12, 13), {"rows": [{"prompt": "again"}], "num_generations": 4})]
    off = load_config("ar3po", ["algorithm.scale_rewards=false"])
    assert build_batch_source(off, OnPolicyQueue(), None).scale_rewards is False
    assert build_batch_source(off, OnPolicyQueue(), None).produce is None


def test_build_exgrpo_source_wires_producer_learner_and_config():
    cfg = load_config(
        "exgrpo",
        [
            "rollout.num_generations=6",
            "train.epochs=3",
            "train.seed=5",
            "method.exgrpo.store_per_question=4",
            "method.exgrpo.store_questions=9",
        ],
    )
    producer = RecordingProducer()
    learner = SimpleNamespace(mean_entropies=lambda rollouts: [0.0] * len(rollouts))
    src = build_batch_source(cfg, OnPolicyQueue(), producer, learner)  # type: ignore[arg-type]
    assert isinstance(src, ExgrpoSource)
    assert src.produce == producer.produce and src.entropies == learner.mean_entropies
    assert src.rows() == producer.last_rows
    assert [r["prompt"] for r in src.sample_rows(2)] == ["q0", "q1"]
    assert producer.samples == [(2, producer.prompt_rng)]  # the producer's own prompt stream
    assert src.epochs == 3 and src.scale_rewards is True and src.ex is cfg.method.exgrpo
    st = src.store
    assert (st.group_size, st.per_question, st.max_questions) == (6, 4, 9)
    # its own generator, seeded train.seed + 4 (not the run's stream)
    assert np.array_equal(src.rng.integers(0, 1 << 30, 8), make_rng(9).integers(0, 1 << 30, 8))

    bare = build_batch_source(
        load_config("exgrpo", ["algorithm.scale_rewards=false"]), OnPolicyQueue(), None, None
    )
    assert bare.produce is None and bare.entropies is None and bare.scale_rewards is False
    assert bare.rows() == {} and bare.sample_rows(3) == []


# build_components / build_producer / remix_window over a real tiny run (survivors of a
# random sample of the wiring scope's mutants)


def test_build_components_wires_config_learner_and_system_prompt(tmp_path):
    from replayrl.models.loading import unwrap_model
    from replayrl.run.components import build_components
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "rewards=[{name: digits_format}]",
        "task.system_prompt=Answer with digits.",
        config="exgrpo",
    )
    parts = build_components(cfg, log=lambda _: None)
    assert parts.cfg is cfg
    # ExGRPO picks each question's lowest-entropy trajectory with the learner's entropies;
    # without them it silently falls back to a random choice
    assert parts.source.entropies == parts.learner.mean_entropies
    assert parts.render.system_prompt == "Answer with digits."
    assert parts.producer.render.system_prompt == "Answer with digits."
    assert parts.generator.model is unwrap_model(parts.model)


def test_build_producer_without_a_generator_makes_one_on_the_models_weights(tmp_path):
    from replayrl.models.loading import unwrap_model
    from replayrl.run.components import build_components, build_producer
    from tiny import tiny_config

    cfg = tiny_config(tmp_path, "rewards=[{name: digits_format}]")
    parts = build_components(cfg, log=lambda _: None)
    producer = build_producer(
        cfg, parts.model, parts.tokenizer, parts.model_path, np.random.default_rng(0), print
    )
    assert producer.generator is not parts.generator  # its own, as async workers build it
    assert producer.generator.model is unwrap_model(parts.model)


def test_remix_window_draws_from_the_runs_seed():
    import torch

    from replayrl.data.rollout_record import Rollout
    from replayrl.methods.remix import remix_window

    def window(seed: int):
        cfg = load_config("remix-grpo", [f"train.seed={seed}"])
        w = remix_window(cfg)
        assert w is not None and w.capacity == cfg.method.remix.num_policies * cfg.rollouts_per_step
        w.push(
            [
                Rollout(
                    torch.tensor([1]),
                    torch.tensor([2]),
                    torch.zeros(1),
                    float(i),
                    0.0,
                    True,
                    0,
                    0,
                    0,
                )
                for i in range(w.capacity)
            ]
        )
        return [r.reward for r in w.sample(8, current_version=0)]

    assert window(0) == window(0)  # reproducible
    assert window(0) != window(1) != window(2)  # and the run's seed reaches it
