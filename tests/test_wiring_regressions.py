"""Tests for the wiring bugs a reviewer planted that the suite missed:

- `auto` design's N and B swapped (the saved config and the design record agreed, both swapped);
- ReMix's window capacity ignoring N_pol;
- a TRL keyword of `ReplayConfig` mapped to the wrong config key;
- `top_p` dropped by the fast generator;
- (the async replay-ratio counter never incremented: tests/test_async_batch_source.py).
Each is checked against an independent expectation, not against the code's own record."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import replayrl.run.loops.auto as design_auto
from replayrl.api.config import ReplayConfig
from replayrl.api.trl_args import DIRECT, SPECIAL
from replayrl.config.schema import Config, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.design.theory import closed_form_power_law
from replayrl.methods.remix import remix_window
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.rollout.generation.sampling import top_p_keep


def _rollout(i: int, version: int) -> Rollout:
    ids = torch.tensor([1, 2])
    return Rollout(ids, ids, torch.zeros(2), 0.0, 0.0, False, i, version, version)


# -- auto design --------------------------------------------------------------------------------
def test_auto_design_puts_x_star_r_in_the_buffer_and_y_star_r_in_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # mu = 5.3, alpha = 0.25, rho = 0.5, R = 8, by hand (not read from the run's record): the
    # closed form's x* = 0.96 < 1 is clamped to the feasible x = 1 (N = R = 8), and y at x = 1
    # is sqrt(mu / (rho + 1/x)) = sqrt(5.3 / 1.5) = 1.88, so B = round(1.88 * 8) = 15
    mu, R = 5.3, 8
    monkeypatch.setattr(design_auto, "estimate_mu", lambda mus: mu)
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4",
            "method.name=replay",
            "buffer.capacity=auto",
            "train.batch_size=auto",
            "design.alpha=0.25",  # numbers: the scripted session has no learner to probe
            "design.rho=0.5",
            # B > N allowed: the one case where N != B at these values, so a swap is seen
            "design.allow_b_above_n=true",
        ],
    )
    monkeypatch.setattr(
        design_auto, "produce_fresh", lambda *parts: ([_rollout(i, 0) for i in range(R)], {})
    )
    s = SimpleNamespace(
        cfg=cfg,
        learner=SimpleNamespace(measure_backward=lambda rollouts: None, version=0),
        counters=SimpleNamespace(generation_seconds=0.0),
        producer=None,  # produce_fresh is scripted above
        source=None,
        log=lambda _: None,
    )
    new, warmup, record = design_auto.auto_design(s)  # type: ignore[arg-type]
    x_free, _ = closed_form_power_law(mu, 0.25, 0.5)
    assert x_free < 1  # so the buffer is clamped to one step
    y = math.sqrt(mu / (0.5 + 1 / 1.0))  # at the feasible x = 1
    N, B = R, round(y * R)
    assert (N, B) == (8, 15)  # N != B: a swap would be seen
    assert (new.buffer.capacity, new.batch_size) == (N, B)
    assert (record["N"], record["B"]) == (N, B)
    assert math.isclose(record["x"], N / R) and math.isclose(record["y"], B / R)
    assert math.isclose(record["x_star"], x_free)
    assert len(warmup) == cfg.design.warmup_steps * R


# -- ReMix window ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n_pol", [1, 3])
def test_remix_window_holds_the_last_n_pol_policies_rollouts(n_pol: int) -> None:
    R = 8
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4",
            "method.name=remix",
            "algorithm.loss_type=mix_ppg",
            f"method.remix.num_policies={n_pol}",
        ],
    )
    window = remix_window(cfg) if (cfg.method.name == "remix") else None
    assert window is not None
    for step in range(5):  # 5 policies' rollouts pushed: only the last N_pol stay
        window.push([_rollout(i, step) for i in range(R)])
    assert len(window) == n_pol * R
    kept = {r.policy_version for r in window.sample(n_pol * R, current_version=5)}
    assert kept <= set(range(5 - n_pol, 5))


# -- TRL keywords ---------------------------------------------------------------------------------
# each TRL GRPOConfig name with a value unlike any default, and where ReplayConfig documents it
# lands (written out here, not read from TRL_KEYS)
TRL_EXPECTED: dict[str, tuple[Any, str, Any]] = {
    "max_steps": (7, "train.steps", 7),
    "learning_rate": (3.3e-5, "train.lr", 3.3e-5),
    "weight_decay": (0.07, "train.weight_decay", 0.07),
    "max_grad_norm": (0.77, "train.max_grad_norm", 0.77),
    "seed": (123, "train.seed", 123),
    "num_iterations": (3, "train.epochs", 3),
    "num_generations": (4, "rollout.num_generations", 4),
    "max_completion_length": (13, "rollout.max_new_tokens", 13),
    "temperature": (0.77, "rollout.temperature", 0.77),
    "top_p": (0.83, "rollout.top_p", 0.83),
    "top_k": (5, "rollout.top_k", 5),
    "min_p": (0.1, "rollout.min_p", 0.1),
    "repetition_penalty": (1.1, "rollout.repetition_penalty", 1.1),
    "beta": (0.017, "kl.beta", 0.017),
    "epsilon": (0.13, "algorithm.epsilon", 0.13),
    "epsilon_high": (0.29, "algorithm.epsilon_high", 0.29),
    "importance_sampling_level": ("sequence", "algorithm.importance_sampling_level", "sequence"),
    "mask_truncated_completions": (True, "algorithm.mask_truncated_completions", True),
    "eval_steps": (11, "eval.every", 11),
    "save_steps": (9, "checkpoint.every", 9),
    "save_total_limit": (5, "checkpoint.keep_last", 5),
    "output_dir": ("runs/x/mine", "logging.name", "mine"),
    # TRL's generation_batch_size is completions per step: prompts = 48 / num_generations (4)
    "generation_batch_size": (48, "rollout.prompts_per_step", 12),
    "scale_rewards": ("none", "algorithm.scale_rewards", False),
    "report_to": ("tensorboard", "logging.tensorboard", True),
    "disable_tqdm": (True, "logging.progress", False),
    "vllm_max_model_length": (640, "vllm.max_model_len", 640),
    "vllm_server_host": ("10.1.2.3", "vllm.server.host", "10.1.2.3"),
    "vllm_server_port": (8123, "vllm.server.port", 8123),
    "vllm_server_base_url": ("http://gen:9000", "vllm.server.base_url", "http://gen:9000"),
    "vllm_server_timeout": (99.0, "vllm.server.connect_timeout_s", 99.0),
}
# one-to-one names pinned elsewhere (tests/test_trl_api.py, tests/test_trl_parity.py)
TRL_ELSEWHERE = {
    "warmup_ratio",
    "entropy_coef",
    "activation_checkpointing",
    "gradient_checkpointing",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
}
# keys a TRL name legitimately moves besides its own (documented in api/trl_args.py)
TRL_ALSO_MOVES: dict[str, set[str]] = {
    # TRL's max_steps counts optimizer updates: num_iterations of them per generation step
    "num_iterations": {"train.steps", "checkpoint.every"},
    # TRL's generation_batch_size = prompts x num_generations stays 8 by default
    "num_generations": {"rollout.prompts_per_step"},
    # completions per generation / per update (8) = updates per step, as in TRL
    "generation_batch_size": {"train.steps", "checkpoint.every", "train.mini_batch_size"},
}


def _get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_every_simple_trl_name_has_an_expectation() -> None:
    # the names mapped one to one, plus the special ones this table pins; the rest of the
    # special names (batch terms, schedules, strategies) are pinned in tests/test_trl_api.py
    assert set(DIRECT) - set(TRL_EXPECTED) <= TRL_ELSEWHERE
    assert set(TRL_EXPECTED) <= set(DIRECT) | set(SPECIAL)


@pytest.mark.parametrize("name", sorted(TRL_EXPECTED))
def test_each_trl_keyword_sets_the_key_it_documents(name: str) -> None:
    value, key, expected = TRL_EXPECTED[name]
    extra: dict[str, Any] = {"num_generations": 4} if name == "generation_batch_size" else {}
    if name == "eval_steps":
        extra = {"eval_strategy": "steps"}  # TRL evaluates only when asked
    # any TRL name starts from TRL's defaults: compare with another TRL-named config
    anchor = {"max_steps": 5} if name != "max_steps" else {"seed": 1}
    default = ReplayConfig(**anchor, **extra).to_config()
    cfg = ReplayConfig(**anchor, **{name: value}, **extra).to_config()
    assert _get(cfg, key) == expected and _get(default, key) != expected
    # and nothing else moved (a name mapped to two keys, or to the wrong one as well)
    changed = _diff(default.model_dump(), cfg.model_dump())
    allowed = {key, "logging.run_dir"} if name == "output_dir" else {key}
    allowed |= TRL_ALSO_MOVES.get(name, set())
    assert changed <= allowed and key in changed


def test_reward_weights_reach_the_trainer_side() -> None:
    assert ReplayConfig(reward_weights=[2, 0.5]).reward_weights == [2.0, 0.5]


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k in a:
        if isinstance(a[k], dict) and isinstance(b[k], dict) and a[k]:
            out |= _diff(a[k], b[k], f"{prefix}{k}.")
        elif a[k] != b[k]:
            out.add(prefix + k)
    return out


# -- top_p in the fast generator ------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["fast", "fast_hf", "generate"])
def test_sampling_with_top_p_stays_inside_the_nucleus(tiny_model, char_tokenizer, impl) -> None:
    prompt, top_p, temperature = "12+34=", 0.3, 1.0
    ids = torch.tensor([char_tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = tiny_model(ids).logits[0, -1].float() / temperature
    probs_sorted, order = torch.softmax(logits, -1).sort(descending=True)
    nucleus = set(order[top_p_keep(probs_sorted, top_p)].tolist())
    assert len(nucleus) <= logits.numel() // 3  # a real truncation of the vocabulary
    gen = HFGenerator(tiny_model, char_tokenizer, impl=impl)
    torch.manual_seed(0)
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=1)
    first = [int(s.completion_ids[0]) for s in gen.generate([prompt], 200, params)]
    assert set(first) <= nucleus
    assert len(set(first)) > 1 or len(nucleus) == 1  # sampled, not greedy


# -- the special TRL names, value by value ---------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "key", "expected"),
    [
        ({"scale_rewards": True}, "algorithm.scale_rewards", True),
        ({"scale_rewards": False}, "algorithm.scale_rewards", False),
        ({"scale_rewards": "group"}, "algorithm.scale_rewards", True),
        ({"scale_rewards": "none"}, "algorithm.scale_rewards", False),
        ({"report_to": "all"}, "logging.wandb", True),
        ({"report_to": "all"}, "logging.tensorboard", True),
        ({"report_to": "tensorboard"}, "logging.tensorboard", True),
        ({"report_to": "tensorboard"}, "logging.wandb", False),
        ({"report_to": ["wandb", "tensorboard"]}, "logging.wandb", True),
        ({"report_to": None}, "logging.tensorboard", False),
        ({"disable_tqdm": False}, "logging.progress", True),
        ({"generation_batch_size": 16, "num_generations": 8}, "rollout.prompts_per_step", 2),
        ({"output_dir": "a/b/run"}, "logging.run_dir", "a/b"),
        ({"method__name": "replay", "buffer__capacity": 256}, "buffer.capacity", 256),
    ],
)
def test_trl_special_values(kwargs: dict[str, Any], key: str, expected: Any) -> None:
    cfg = ReplayConfig(**kwargs).to_config()
    assert _get(cfg, key) == expected
    assert type(_get(cfg, key)) is type(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale_rewards": 1}, "scale_rewards=1: replayrl normalises per group"),
        ({"scale_rewards": "batch"}, "scale_rewards='batch'"),
        ({"report_to": ["tensorboard", "mlflow"]}, r"report_to: unknown \['mlflow'\]"),
        (
            {"generation_batch_size": 10, "num_generations": 4},
            "generation_batch_size=10 must be a positive multiple of num_generations=4",
        ),
        (
            {"generation_batch_size": 2, "num_generations": 4},
            "generation_batch_size=2 must be a positive multiple",
        ),
        ({"output_dir": "runs/.."}, r"output_dir='runs/\.\.' must end in a folder name"),
        ({"output_dir": "."}, r"output_dir='\.' must end in a folder name"),
        (
            {"learning_rat": 1e-4},
            r"unknown argument\(s\) learning_rat \(did you mean learning_rate\?\)",
        ),
    ],
)
def test_bad_trl_values_are_one_line_errors(kwargs: dict[str, Any], message: str) -> None:
    from replayrl.config.schema import ConfigError

    with pytest.raises(ConfigError, match=message):
        ReplayConfig(**kwargs)


def test_overrides_presets_and_sets() -> None:
    from replayrl.config.schema import ConfigError

    base = load_config(None, ["train.lr=0.5"])
    rc = ReplayConfig(base, overrides={"train.steps": 3}, seed=4)
    cfg = rc.to_config()
    assert (cfg.train.lr, cfg.train.steps, cfg.train.seed) == (0.5, 3, 4)
    assert rc.sets("train.steps") and rc.sets("train.seed") and not rc.sets("train.lr")
    assert rc.override_strings() == ["train.seed=4", "train.steps=3"]
    listed = ReplayConfig(overrides=["train.steps = 5", "task.name=a=b"])
    assert listed.sets("train.steps") and listed.sets("task.name") and not listed.sets("a")
    assert ReplayConfig().to_config({"train.steps": 9}).train.steps == 9
    assert ReplayConfig(reward_weights=None).reward_weights is None
    with pytest.raises(ConfigError, match="override 'a..b' has an empty key"):
        ReplayConfig(overrides={"a..b": 1}).data()
    with pytest.raises(ConfigError, match="override 'train.lr.x': train.lr is a value"):
        ReplayConfig(base, overrides={"train.lr.x": 1}).data()
    with pytest.raises(TypeError, match="overrides must be a list of 'key=value' strings"):
        ReplayConfig(overrides="train.lr=1")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"a YAML path, a Config or a TRL GRPOConfig \(got <class 'int'>\)"
    ):
        ReplayConfig(3)  # type: ignore[arg-type]


def test_replay_config_repr_shows_what_was_given() -> None:
    rc = ReplayConfig("grpo", overrides=["train.lr=1"], seed=3)
    assert repr(rc) == "ReplayConfig('grpo', seed=3, overrides=['train.lr=1'])"
    assert repr(ReplayConfig(load_config(None, []))) == "ReplayConfig(Config(...))"
