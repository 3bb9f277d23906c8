"""Every config key that changes training is wired: set it, observe an effect.

A table over the config schema. Each key is either OBSERVED (an observer, the value to set,
and the context overrides under which the key matters) or NOT_OBSERVED with the reason (where
it is tested instead, or why it cannot change training). A new key without an entry fails
`test_every_schema_key_has_an_entry`. Observers are cheap: built components (buffers, the
ReMix window, the batch source), two learner steps on a tiny model and fixed rollouts, the
producer on a scripted generator, `auto` design with a fixed mu, evaluation on a scripted
generator, the tiny model's construction.
"""

from __future__ import annotations

import copy
import json
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import replayrl.run.loops.auto as design_auto
from replayrl.algorithms import ADVANTAGES, group_advantages
from replayrl.api.config import config_keys
from replayrl.config.schema import Config, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.critic import ValueModel
from replayrl.learner.learner import Learner
from replayrl.methods.remix import remix_window
from replayrl.models.loading import build_tiny_model
from replayrl.rollout.evaluation import evaluate_policy, held_out_rows
from replayrl.rollout.generation import Sample, SamplingParams
from replayrl.rollout.producer import RolloutProducer
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.rewards import resolve_rewards
from replayrl.rollout.tasks import task_from_config
from replayrl.run.components import build_batch_source, build_buffer
from replayrl.run.state import Counters

R_OVERRIDES = ("rollout.prompts_per_step=2", "rollout.num_generations=4")  # R = 8
REMIX = ("method.name=remix", "algorithm.loss_type=mix_ppg", "method.remix.reincarnation_step=2")
REPLAY = ("method.name=replay", "buffer.capacity=16")
CONVEX = ("kl.beta=0.5", "kl.target=convex", "kl.schedule.start=0", "kl.schedule.every=1")
GAE = ("algorithm.advantage=gae",)
SIGNAL = ("method.name=signal_replay", "algorithm.loss_type=mix_ppg", "rollout.prompts_per_step=4")
# the sharded learner's step as tests/test_fsdp_options.py runs it (its probes are shared)
SHARDED = (
    "rollout.prompts_per_step=3",
    "train.lr=1e-4",
    "runtime=ray",
    "train.sharding=fsdp",
)


# -- observers --------------------------------------------------------------------------------
def _rollout(i: int, version: int, prompt: torch.Tensor | None = None) -> Rollout:
    ids = torch.tensor([1, 2]) if prompt is None else prompt
    return Rollout(
        ids, torch.tensor([3, 4]), torch.zeros(2), float(i % 2), 0.0, i % 3 == 0, i, version, 0
    )


def observe_data(cfg: Config, _: Any) -> Any:
    """The buffer's draws, the ReMix window's size and the batch source's (size, passes) over
    four steps of R fresh rollouts each."""
    R = cfg.rollouts_per_step
    buf = build_buffer(cfg)
    buf.push([_rollout(i, i // 8) for i in range(24)])
    draws = [[r.group_id for r in buf.sample(6, current_version=3)] for _ in range(2)]
    window = remix_window(cfg) if (cfg.method.name == "remix") else None
    if window is not None:
        window.push([_rollout(i, i // R) for i in range(5 * R)])
    source = build_batch_source(cfg, build_buffer(cfg))
    counters = Counters()
    learner = SimpleNamespace(reincarnate=lambda: None, version=0)
    batches = []
    for step in range(4):
        counters.step = step
        source.before_step(learner, counters, lambda _: None)
        # ReMix's fixed composition generates fewer prompts while mixing
        prompts = source.prompts_this_step()
        fresh = R if prompts is None else prompts * cfg.rollout.num_generations
        batch, passes = source.next_batch([_rollout(i, step) for i in range(fresh)], step)
        counters.rollouts_generated += fresh
        batches.append((fresh, len(batch), passes))
    return draws, len(buf), None if window is None else len(window), batches


def observe_signal(cfg: Config, _: Any) -> Any:
    """Signal replay's batches over eight steps of four groups of four: step 0 has three
    groups with signal and one all wrong, every later step two all wrong, one all right and
    none with signal (so the store alone fills). A scripted learner moves a stored group's
    members apart with its age a (sequence log-weights 0, a/3, 2a/3, a: ESS 0.52 at age 3,
    0.43 at age 4). Per step: the versions of the batch's rows and the passes; then the
    source's counts."""
    source = build_batch_source(cfg, build_buffer(cfg))
    counters = Counters()

    def current(rollouts: list[Rollout]) -> list[torch.Tensor]:
        age = [learner.version - r.policy_version for r in rollouts]
        return [
            r.behaviour_logprobs + a * (r.completion_ids[1] - 4) / 6
            for r, a in zip(rollouts, age, strict=True)
        ]

    learner = SimpleNamespace(
        version=0,
        current_logprobs=current,
        behaviour_logprobs=lambda rs: [r.behaviour_logprobs for r in rs],
    )
    first, later = [[1, 0, 1, 0]] * 3 + [[0] * 4], [[0] * 4, [0] * 4, [1] * 4]
    out = []
    for step in range(8):
        learner.version = counters.step = step
        source.before_step(learner, counters, lambda _: None)
        fresh = [
            Rollout(
                torch.tensor([1, 2]),
                torch.tensor([3, 4 + i]),
                torch.zeros(2),
                float(x),
                x - 0.5,
                bool(x),
                4 * step + j,
                step,
                step,
            )
            for j, rs in enumerate(first if step == 0 else later)
            for i, x in enumerate(rs)
        ]
        batch, passes = source.next_batch(fresh, step)
        out.append(([r.policy_version for r in batch], passes))
    return out, dict(counters.source_counts)


class ScriptedGenerator:
    """Completions of arithmetic prompts: the right sum for even samples, a wrong one for odd
    (so groups have reward variance); records what it was asked."""

    policy_version = 0

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int, SamplingParams]] = []

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[Sample]:
        self.calls.append((prompts, n, params))
        out = []
        for i, p in enumerate(prompts):
            answer = sum(int(x) for x in re.findall(r"[+-]?\d+", p.split("=")[0]))
            for j in range(n):
                text = str(answer) if j % 2 == 0 else str(answer + 1 + j)
                ids = torch.arange(len(text) + 1)
                out.append(Sample(i, torch.ones(3), ids, torch.zeros(len(ids)), text, False, 0))
        return out


def observe_producer(cfg: Config, tok: Any) -> Any:
    """The producer on a scripted generator: what it asks for, the rewards and advantages it
    stores; plus the task's held-out split."""
    task = task_from_config(cfg.task)
    rewards = resolve_rewards([(r.name, r.weight) for r in cfg.rewards])
    gen = ScriptedGenerator()
    render = PromptRenderer(tok, cfg.task.chat_template, cfg.task.system_prompt)
    producer = RolloutProducer(
        cfg, task, rewards, tok, render, gen, None, np.random.default_rng(0), log=lambda _: None
    )
    p = producer.produce(version=0, step=0, group_base=0)
    asked = [(prompts, n, params) for prompts, n, params in gen.calls]
    stored = [(r.reward, round(r.advantage, 5)) for r in p.rollouts]
    return asked, stored, [r["prompt"] for r in task.eval_rows()[:3]], len(task.eval_rows())


def _fixed_rollouts(model: Any, tok: Any) -> list[Rollout]:
    """8 rollouts of 2 prompts x 4 (greedy-free, seeded) with behaviour log-probs off by a
    little (so importance ratios differ from 1 and clipping acts) and GRPO advantages."""
    from replayrl.rollout.generation import HFGenerator

    torch.manual_seed(0)
    samples = HFGenerator(model, tok).generate(
        ["12+34=", "7+80="], 4, SamplingParams(max_new_tokens=4)
    )
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([s.prompt_index for s in samples])
    adv, means = group_advantages(rewards, groups)
    g = torch.Generator().manual_seed(1)
    return [
        Rollout(
            s.prompt_ids,
            s.completion_ids,
            s.logprobs + 0.3 * torch.randn(s.logprobs.shape, generator=g),
            float(rewards[i]),
            float(adv[i]),
            bool(rewards[i]),
            s.prompt_index,
            0,
            0,
            group_mean_reward=float(means[i]),
            truncated=s.truncated,  # hit max_new_tokens (mask_truncated_completions)
        )
        for i, s in enumerate(samples)
    ]


def observe_learner(cfg: Config, ctx: Any) -> Any:
    """Policy (and critic) parameters after two learner steps (t = 4, 5) on fixed rollouts."""
    model, tok, rollouts = ctx
    critic = None
    if ADVANTAGES.get(cfg.algorithm.advantage).needs_critic:
        torch.manual_seed(2)
        critic = ValueModel(copy.deepcopy(model.model), model.config.hidden_size)
        torch.nn.init.normal_(critic.head.weight, std=0.5)
    learner = Learner(copy.deepcopy(model), tok.pad_token_id, cfg, critic=critic)
    learner.fuse_behaviour_recompute = False
    rng = np.random.default_rng(0)
    batch = copy.deepcopy(rollouts)
    for step in (4, 5):  # fresh at t = 4, stale (an older version's) at t = 5
        learner.train_step(batch, rng, step=step)
    parts = [learner.model] + ([critic] if critic is not None else [])
    return torch.cat([p.detach().flatten() for m in parts for p in m.parameters()])


def observe_design(cfg: Config, _: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`auto` N and B from a fixed mu = 4 (the warm-up's timing would make it noisy)."""
    monkeypatch.setattr(design_auto, "estimate_mu", lambda mus: 4.0)
    produced = []

    def produce():
        produced.append(1)
        return [_rollout(i, 0) for i in range(cfg.rollouts_per_step)], {}

    monkeypatch.setattr(design_auto, "produce_fresh", lambda *parts: produce())
    s = SimpleNamespace(
        cfg=cfg,
        learner=SimpleNamespace(measure_backward=lambda rollouts: None, version=0),
        counters=SimpleNamespace(generation_seconds=0.0),
        producer=None,  # produce_fresh is scripted above
        source=None,
        log=lambda _: None,
    )
    new, _, record = design_auto.auto_design(s)  # type: ignore[arg-type]
    return new.buffer.capacity, new.batch_size, len(produced)


class EvalGenerator:
    policy_version = 0

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, SamplingParams]] = []

    def generate(self, prompts, n, params):
        self.calls.append((len(prompts), n, params))
        return [
            Sample(i, torch.ones(2), torch.arange(3), torch.zeros(3), str(i + j), False, 0)
            for i in range(len(prompts))
            for j in range(n)
        ]


def observe_eval(cfg: Config, _: Any) -> Any:
    task = task_from_config(cfg.task)
    gen = EvalGenerator()
    result = evaluate_policy(cfg, gen, task, held_out_rows(cfg, task))
    return gen.calls, result


def observe_model(cfg: Config, _: Any) -> Any:
    model = build_tiny_model(cfg.model, vocab_size=20, seed=0)
    return model.config.to_dict(), sum(p.numel() for p in model.parameters())


def observe_sharded(cfg: Config, _: Any) -> Any:
    """One sharded step on `workers.learners` spawned gloo ranks (tests/sharded_probe.py):
    each rank's mesh, local shard shapes, gathered and matmul dtypes, and its weights after."""
    from sharded_probe import probe  # tests/sharded_probe.py

    p = probe(cfg)
    layout = [
        (r["mesh_shape"], r["local_shapes"], r["gathered_dtypes"], r["matmul_dtypes"])
        for r in p.ranks
    ]
    return layout, [torch.cat([v.flatten() for v in full.values()]) for full in p.full]


OBSERVERS = {
    "data": observe_data,
    "signal": observe_signal,
    "producer": observe_producer,
    "learner": observe_learner,
    "design": observe_design,
    "eval": observe_eval,
    "model": observe_model,
    "sharded": observe_sharded,
}

# key -> (observer, value to set, context overrides under which the key matters[, overrides
# set together with the key, for a key that does nothing alone])
OBSERVED: dict[str, tuple[Any, ...]] = {
    # the batch: buffers, ReMix's window and the batch source
    "method.name": ("data", "replay", ("buffer.capacity=16",)),
    "buffer.capacity": ("data", 8, REPLAY),
    # with delta = 0 positive bias is uniform by construction; delta alone is invalid
    "buffer.sampler": ("data", "positive_bias", REPLAY, ("buffer.delta=0.9",)),
    "buffer.delta": ("data", 0.9, (*REPLAY, "buffer.sampler=positive_bias")),
    "buffer.with_replacement": ("data", True, REPLAY),
    "buffer.num_shards": ("data", 2, REPLAY),
    "buffer.max_staleness": ("data", 1, ()),
    # x = N/R and y = B/R: N = round(x R), B = round(y R) at R = 8
    "buffer.staleness_horizon": ("data", 1, ("method.name=replay", "buffer.staleness_horizon=2")),
    "buffer.replay_ratio": ("data", 0.5, REPLAY),
    "train.seed": ("data", 7, REPLAY),
    "train.batch_size": ("data", 4, ()),
    "train.epochs": ("data", 2, ()),
    # fixed composition: round((1 - p) P) fresh prompts, 3 at p = 0.4 and 2 at p = 0.6 (P = 5)
    "method.remix.off_policy_fraction": ("data", 0.6, (*REMIX, "rollout.prompts_per_step=5")),
    "method.remix.num_policies": ("data", 3, REMIX),
    "method.remix.utd": ("data", 3, REMIX),
    "method.remix.reincarnation_step": ("data", 3, REMIX),
    "method.remix.utd_after": ("data", 2, REMIX),
    # at 8 of a 32-rollout budget: reincarnation at step 1 (without it: never, T is null)
    "method.remix.reincarnation_at": (
        "data",
        0.25,
        (*REMIX, "method.remix.reincarnation_step=null", "train.rollout_budget=32"),
    ),
    "method.remix.composition": ("data", "additive", REMIX),
    # signal replay's fill, window, uses, ESS eviction and filter (observe_signal's script)
    "method.signal_replay.target": ("signal", 1.0, SIGNAL),
    "method.signal_replay.window": ("signal", 2, SIGNAL),
    "method.signal_replay.max_uses": ("signal", 2, SIGNAL),
    "method.signal_replay.min_ess": ("signal", 0.0, SIGNAL),
    "method.signal_replay.train_zero_advantage": ("signal", True, SIGNAL),
    "rollout.prompts_per_step": ("producer", 3, ()),
    "rollout.num_generations": ("producer", 2, ()),
    "rollout.temperature": ("producer", 0.7, ()),
    "rollout.top_p": ("producer", 0.9, ()),
    "rollout.top_k": ("producer", 5, ()),
    "rollout.min_p": ("producer", 0.1, ()),
    "rollout.repetition_penalty": ("producer", 1.2, ()),
    "rollout.max_new_tokens": ("producer", 5, ()),
    "rewards": ("producer", [{"name": "correctness", "weight": 2.0}], ()),
    "algorithm.scale_rewards": ("producer", False, ()),
    "algorithm.advantage": ("producer", "rloo", ()),
    "task.name": ("producer", "reasoning", ()),
    "task.arithmetic.digits": ("producer", 3, ()),
    "task.reasoning.op": ("producer", "sub", ("task.name=reasoning",)),
    "task.reasoning.digits": ("producer", 3, ("task.name=reasoning",)),
    "task.reasoning.min_digits": ("producer", 2, ("task.name=reasoning",)),
    "task.reasoning.terms": ("producer", 3, ("task.name=reasoning", "task.reasoning.op=chain")),
    "task.eval_size": ("producer", 50, ()),
    "task.seed": ("producer", 5, ()),
    "train.lr": ("learner", 0.05, ()),
    "train.weight_decay": ("learner", 0.5, ()),
    "train.max_grad_norm": ("learner", 0.001, ()),
    "train.mini_batch_size": ("learner", 4, ()),
    "algorithm.loss_type": ("learner", "asymre", ()),
    "algorithm.epsilon": ("learner", 0.01, ()),
    "algorithm.epsilon_high": ("learner", 0.5, ()),
    "algorithm.loss_agg": ("learner", "seq_mean", ()),
    "algorithm.asymre_delta_v": ("learner", 0.5, ("algorithm.loss_type=asymre",)),
    "algorithm.entropy_coef": ("learner", 0.5, ()),
    "algorithm.importance_sampling_level": ("learner", "sequence", ()),
    "algorithm.mask_truncated_completions": ("learner", True, ()),
    "kl.beta": ("learner", 0.5, ()),
    "kl.estimator": ("learner", "k1", ("kl.beta=0.5",)),
    "kl.target": ("learner", "convex", ("kl.beta=0.5", "kl.schedule.start=0")),
    "kl.schedule.start": ("learner", 3, CONVEX),
    "kl.schedule.every": ("learner", 2, CONVEX),
    "kl.schedule.decrement": ("learner", 0.05, CONVEX),
    "kl.schedule.floor": ("learner", 0.9, CONVEX),
    "critic.lr": ("learner", 0.01, GAE),
    "critic.value_clip": ("learner", 0.01, (*GAE, "train.epochs=2", "critic.lr=0.01")),
    "critic.gamma": ("learner", 0.5, GAE),
    "critic.lam": ("learner", 0.5, GAE),
    "precision.learner_autocast": ("learner", "bfloat16", ()),
    "precision.recompute_behaviour_logprobs": ("learner", "always", ()),
    "precision.truncated_is_cap": (
        "learner",
        1.01,
        ("precision.recompute_behaviour_logprobs=always",),
    ),
    "precision.importance_sampling_mode": (
        "learner",
        "token_mask",
        ("precision.recompute_behaviour_logprobs=always", "precision.truncated_is_cap=1.01"),
    ),
    # with the default 5% bar auto stays on-policy at mu = 4 (predicted saving 4.8%); at bar 0
    # alpha = 0.05 moves x* above 1 (N = 81 instead of 8) and rho = 0.9 gives B = 12, not 13
    "design.alpha": ("design", 0.05, ("design.min_saving=0",)),
    "design.rho": ("design", 0.9, ("design.min_saving=0",)),
    "design.min_saving": ("design", 0.0, ()),
    # a given mu replaces the (here fixed) measured 4: at 20 reuse pays, N and B grow
    "design.mu": ("design", 20.0, ()),
    # at mu = 20 (alpha 0.25, rho 0.5) y*(x) > x near the optimum: B > N only when allowed
    "design.allow_b_above_n": ("design", True, ("design.mu=20",)),
    "design.warmup_steps": ("design", 3, ()),
    "eval.num_prompts": ("eval", 2, ()),
    "eval.pass_k": ("eval", 3, ()),
    "eval.temperature": ("eval", 0.5, ("eval.pass_k=2",)),
    "model.tiny.num_layers": ("model", 1, ()),
    "model.tiny.hidden_size": ("model", 64, ()),
    "model.tiny.num_heads": ("model", 2, ()),
    "model.tiny.intermediate_size": ("model", 256, ()),
    # spawned gloo ranks (slow): fp32 -> bf16 gathered weights and matmuls, fp32 master
    # weights (tests/test_fsdp_options.py asserts each); 4 ranks as 2 replicas x 2 shards
    "train.sharding_param_dtype": ("sharded", "bfloat16", (*SHARDED, "workers.learners=2")),
    "train.sharding_replicas": ("sharded", 2, (*SHARDED, "workers.learners=4")),
}

ELSEWHERE = "tested end to end in"
NOT_OBSERVED: dict[str, str] = {
    "design.reuse_on_fallback": "matters only when alpha / rho fall back (the observer gives "
    "numbers): tests/test_design.py::test_on_fallback_values_auto_stays_on_policy_unless_told_"
    "to_reuse",
    "design.confidence": "matters only when alpha / rho are measured and the design reuses: "
    "tests/test_design.py::test_a_measured_design_reuses_only_when_its_saving_survives_the_"
    "bootstrap",
    "design.bootstrap": "the number of bootstrap draws: tests/test_design.py::test_a_measured_"
    "design_reuses_only_when_its_saving_survives_the_bootstrap (seen[-1] == (10, 3))",
    "design.probe_batches": "how many batches the alpha / rho probe measures per policy: "
    "tests/test_design.py::test_the_probe_hands_the_estimator_staleness_clusters_and_the_runs_"
    "seed (2 batches x 3 policies)",
    "design.allow_y_below_one": "matters only where y*(1) < 1 (mu < 1 + rho), below the "
    "observer's fixed mu = 4: tests/test_design.py::test_y_below_one_only_when_allowed",
    "train.failure_patience": "ends a run after K failing steps: default K = 3 end to end and "
    "score(patience=K) in tests/test_faults_reliability.py",
    **{
        f"method.dynamic_sampling.{k}": "DAPO's source, built from the config and run: "
        "tests/test_groups.py (test_config_keys_reach_the_sources, max_rounds, carrying)"
        for k in ("carry_surplus", "max_rounds", "std_tol", "train_prompts")
    },
    **{
        f"method.group_replay.{k}": "TRL's group replay, built from the config and run: "
        "tests/test_groups.py (test_config_keys_reach_the_sources, zero_std_tol)"
        for k in ("capacity", "include_current", "zero_std_tol")
    },
    **{
        f"method.ar3po.{k}": "AR3PO's source, built from the config and run: tests/test_ar3po.py "
        "(test_config_keys_reach_the_source and each key's own test)"
        for k in (
            "max_rounds",
            "stop_correct",
            "reuse",
            "store_per_prompt",
            "store_prompts",
            "reuse_logprobs",
        )
    },
    **{
        f"method.exgrpo.{k}": "ExGRPO's source and loss, built from the config and run: "
        "tests/test_exgrpo.py (test_config_keys_reach_the_exgrpo_source, the sampler, selection, "
        "start and loss tests)"
        for k in ("ratio", "sigma", "selection", "start_accuracy", "shaping_beta")
    },
    **{
        f"method.exgrpo.{k}": "the experience store's caps, built from the config: "
        "tests/test_exgrpo.py (test_config_keys_reach_the_exgrpo_source, "
        "test_store_caps_drop_the_oldest_trajectories_and_questions)"
        for k in ("store_per_question", "store_questions")
    },
    **{
        f"method.repo.{k}": "RePO's source, built from the config and run: tests/test_repo.py "
        "(test_config_keys_reach_the_repo_source, the strategy, source and pool tests)"
        for k in ("strategy", "num_replays", "buffer_size", "min_buffer", "prompt_pool")
    },
    "method.repo.max_prompts": "the per-prompt buffers' cap, built from the config: "
    "tests/test_repo.py (test_config_keys_reach_the_repo_source, "
    "test_store_keeps_the_newest_per_prompt_and_the_most_recent_prompts)",
    **{
        f"train.{k}": "the per-step learning rate in metrics.jsonl: tests/test_trl_lr.py"
        for k in ("lr_scheduler", "warmup_steps")
    },
    "train.warmup_ratio": "the learner's warm-up, ceil(ratio x steps) steps: tests/"
    "test_trl_lr.py::test_warmup_ratio_sets_the_learners_warm_up",
    "runtime": f"which loop runs: {ELSEWHERE} tests/test_async_runtime.py",
    "model.path": "which model folder loads: tests/test_smollm2.py, tests/test_api.py",
    "model.dtype": "the policy's load dtype: tests/test_precision.py",
    "model.gradient_checkpointing": "memory only (the same gradients)",
    "model.lean_forward": "speed and memory only (the same log-probs): tests/test_lean_forward.py",
    **{
        f"model.lora.{k}": "needs peft and a model build: tests/test_chat_and_lora.py"
        for k in ("enabled", "r", "alpha", "dropout", "target_modules")
    },
    **{
        f"model.warmstart.{k}": "the tiny model's SFT warm start (seconds of training per "
        "setting): tests/test_sft_warmup.py"
        for k in (
            "enabled",
            "steps",
            "batch_size",
            "lr",
            "mistake_steps",
            "mistake_lr",
            "teacher_carry_error",
            "seed",
        )
    },
    **{
        f"model.sft.{k}": "supervised warm-up of a real model: tests/test_sft_warmup.py"
        for k in ("steps", "batch_size", "lr", "teacher_error", "autocast", "lora_r", "seed")
    },
    **{
        f"task.dataset.{k}": "local dataset tasks (files): tests/test_datasets.py, "
        "test_dataset_run.py"
        for k in ("path", "eval_path", "prompt_column", "answer_column", "solution_column")
    },
    "task.dataset.format": "answer extraction of dataset tasks: tests/test_datasets.py",
    "task.chat_template": "needs a tokenizer with a chat template: tests/test_chat_and_lora.py",
    "task.system_prompt": "rendered with a chat template: tests/test_chat_and_lora.py",
    **{
        f"task.reasoning_gym.{k}": "needs the reasoning-gym package: tests/test_reasoning_gym.py"
        for k in ("datasets", "size", "config", "weights")
    },
    "rollout.decode_batch_size": "decode batch (memory / speed): the same samples, "
    "tests/test_generation.py",
    "rollout.reward_timeout_s": "only a slow reward shows it: tests/test_rewards.py",
    "rollout.reward_isolation": "only a reward that ends or hangs its process shows it: "
    "tests/test_faults_reliability.py (I1-I4, R3 with both values)",
    "rollout.backend": "vLLM needs a CUDA GPU: tests/test_vllm_backend.py; a vLLM server: "
    "tests/test_vllm_server_backend.py (a stand-in), tests/test_vllm_server.py (the real one)",
    "rollout.generation_impl": "same samples by design (oracle: fast decode == generate), "
    "tests/test_generation_decoders.py",
    "train.steps": f"run length: {ELSEWHERE} tests/test_run.py",
    "train.rollout_budget": f"run length in generated rollouts: {ELSEWHERE} tests/test_remix.py",
    "eval.every_rollouts": f"when evaluations happen: {ELSEWHERE} tests/test_remix.py",
    "method.remix.replay_advantage": "a check only (each estimator allows one value: group "
    "advantages are stored, a critic's recomputed): tests/test_remix.py",
    "train.micro_batch_size": "memory only: reproduces the full batch step, "
    "tests/test_learner.py::test_micro_batches_reproduce_the_full_batch_step",
    "train.max_tokens_per_micro_batch": "memory only: the row split's gradient, "
    "tests/test_learner_batch.py::test_token_budget_gives_the_row_split_gradient",
    "train.threads": "speed only (torch threads)",
    "train.device": "where tensors live, not what is computed (auto = cpu here): "
    "tests/test_gpu_contracts.py (placement, meta-device inputs) and tests/test_gpu_device.py",
    "train.logprobs_impl": "same log-probs by design: tests/test_logprobs.py",
    "train.preflight": "whether a run that the plan says does not fit its GPU starts (not what "
    "a step computes): tests/test_preflight.py sets error, warn and off",
    "train.sharding": "same step by design (oracle: a sharded Ray step == the single-learner "
    "step), tests/test_ray_fsdp.py and tests/test_fsdp.py",
    "critic.warmup_steps": "read by the session (policy frozen while step < N): "
    "benchmarks/equivalence.py's ppo case, tests/test_wiring.py",
    "eval.every": f"evaluation schedule, not training: {ELSEWHERE} tests/test_run.py",
    "eval.batch_size": "decode batch of `replayrl eval` (speed only)",
    "precision.generation": "generation dtype: tests/test_precision.py",
    "precision.fast_fp32_matmul": "a matmul precision hint (TF32 on GPUs; none on CPU)",
    **{
        f"logging.{k}": "outputs only (folders, sinks, progress bar, warnings), not training"
        for k in (
            "run_dir",
            "name",
            "overwrite",
            "tensorboard",
            "wandb",
            "wandb_project",
            "wandb_entity",
            "progress",
            "reflection_words",
            "no_signal_patience",
        )
    },
    "logging.completions": "outputs only (completions.jsonl): tests/test_completions.py",
    "logging.completions_every": "outputs only (completions.jsonl): tests/test_completions.py",
    "checkpoint.every": "checkpoints, not training: tests/test_checkpoint.py",
    "checkpoint.keep_last": "checkpoints, not training: tests/test_checkpoint.py",
    "workers.replay_ratio": "async pacing: tests/test_async_batch_source.py (tiny run)",
    **{
        f"workers.{k}": f"asynchronous runtimes (processes): {ELSEWHERE} "
        "tests/test_async_runtime.py"
        for k in (
            "generators",
            "learners",
            "sync_every",
            "max_staleness",
            "on_stale",
            "generator_threads",
            "max_pending_batches",
            "max_restarts",
            "startup_timeout",
        )
    },
    **{
        f"ray.{k}": "Ray placement (resources), not training: tests/test_async_runtime.py"
        for k in (
            "address",
            "num_cpus",
            "generator_num_cpus",
            "generator_num_gpus",
            "learner_num_cpus",
            "learner_num_gpus",
            "buffer_num_cpus",
        )
    },
    "ray.placement_timeout": "how long a run waits to be placed, not training: "
    "tests/test_faults_edges.py",
    **{
        f"ray.{k}": "Ray placement on a cluster, not training: tests/test_ray_cluster.py"
        for k in ("generator_resources", "learner_resources", "buffer_resources")
    },
    "ray.weight_sync": "the weight path, not training: tests/test_weight_sync.py and "
    "tests/test_ray_cluster.py (the broadcast's received weights equal the learner's)",
    **{
        f"vllm.{k}": "vLLM engine (CUDA GPU): tests/test_vllm_backend.py"
        for k in (
            "gpu_memory_utilization",
            "tensor_parallel_size",
            "enforce_eager",
            "max_model_len",
            "seed",
        )
    },
    "vllm.truncated_is_cap": "vLLM engine (CUDA GPU): the learner's cap is observed in "
    "tests/test_gpu_contracts.py::test_vllm_truncated_is_is_on_by_default",
    **{
        f"vllm.server.{k}": "where the vLLM server is and how long to wait for it, not what is "
        "trained: tests/test_vllm_server_backend.py (a stand-in server at that address, "
        "unreachable and slow servers)"
        for k in ("host", "port", "base_url", "request_timeout_s", "connect_timeout_s")
    },
    "vllm.server.model": "which served model the run accepts (a check, not training): "
    "tests/test_vllm_server_backend.py::test_another_model_is_refused",
    "vllm.server.weights_dir": "where pushed weights are written for the server (the same "
    "weights either way): tests/test_vllm_server_backend.py::"
    "test_a_push_writes_the_weights_then_reloads_and_drops_the_cache",
    "vllm.server.max_concurrent_requests": "requests in flight (speed only; each prompt has its "
    "own seed): tests/test_vllm_server_backend.py::test_requests_in_flight_are_bounded",
}


def schema_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and v:  # a section (an empty mapping is a value)
            out += schema_keys(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def test_every_schema_key_has_an_entry() -> None:
    keys = set(schema_keys(load_config(None, []).model_dump(mode="json")))
    keys |= set(config_keys())  # with the sections of the tasks the default does not select
    assert not set(OBSERVED) & set(NOT_OBSERVED)
    missing = sorted(keys - set(OBSERVED) - set(NOT_OBSERVED))
    assert missing == [], f"config keys with no effect test and no reason: {missing}"
    assert sorted((set(OBSERVED) | set(NOT_OBSERVED)) - keys) == []  # no stale entries


# -- the table ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def learner_ctx(tiny_model, char_tokenizer):
    return tiny_model, char_tokenizer, _fixed_rollouts(tiny_model, char_tokenizer)


def _observe(name: str, overrides: list[str], ctx: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    extra = ["method.name=replay", "buffer.capacity=auto", "train.batch_size=auto"]
    # numbers, not the default `measured`: the scripted session has no learner to probe
    # (alpha = rho = measured end to end: tests/test_design.py::test_auto_run_measures_*)
    extra += ["design.alpha=0.25", "design.rho=0.5"]
    cfg = load_config(None, [*R_OVERRIDES, *(extra if name == "design" else []), *overrides])
    if name == "design":
        return observe_design(cfg, ctx, monkeypatch)
    return OBSERVERS[name](cfg, ctx)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"


def _table_param(key: str) -> Any:
    # the sharded observer spawns processes: a minute or more per setting on 2 cores
    return pytest.param(key, marks=pytest.mark.slow) if OBSERVED[key][0] == "sharded" else key


@pytest.mark.parametrize("key", [_table_param(k) for k in sorted(OBSERVED)])
def test_setting_a_key_changes_what_it_drives(
    key: str, learner_ctx, char_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, value, context, *together = OBSERVED[key]
    ctx = learner_ctx if name == "learner" else char_tokenizer
    base = _observe(name, list(context), ctx, monkeypatch)
    setting = [_override(key, value), *(together[0] if together else ())]
    changed = _observe(name, [*context, *setting], ctx, monkeypatch)
    assert not _same(base, changed), f"{key}={value!r} changed nothing the {name} observer sees"


def test_the_observers_are_deterministic(learner_ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    # else a key could "change" what a noisy observer sees
    for name in ("learner", "data", "producer", "design"):
        ctx = learner_ctx if name == "learner" else learner_ctx[1]
        a = _observe(name, list(CONVEX), ctx, monkeypatch)
        assert _same(a, _observe(name, list(CONVEX), ctx, monkeypatch)), name
