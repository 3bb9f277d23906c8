"""Typed run configuration: YAML presets + dotted `key=value` overrides, validated by pydantic.

Knob names follow TRL/verl where they exist (num_generations, epsilon, epsilon_high, beta,
loss_type, kl_estimator) so users coming from those tools recognise them.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from replayrl.config.layering import resolve
from replayrl.config.method_sections import DEFAULT_METHOD, place_method_keys
from replayrl.config.overrides import (  # the others: re-exported, imported from here
    ConfigError,
    apply_overrides,  # noqa: F401
    load_yaml,  # noqa: F401
    parse_override,  # noqa: F401
)
from replayrl.config.registries import (
    BACKENDS,
    METHODS,
    REWARDS,
    RUNTIMES,
    SAMPLERS,
    TASKS,
    owned_sections,
    runtimes_with,
)
from replayrl.config.section import Section as _Section  # every section's base
from replayrl.config.section import nested_errors
from replayrl.config.task_sections import place_task_keys

SectionT = TypeVar("SectionT", bound=BaseModel)


def config_value(cfg: BaseModel, key: str) -> Any:
    """The value of dotted key `key` (`method.exgrpo.shaping_beta`) in `cfg`."""
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


class TinyModelConfig(_Section):
    """The built-in tiny Llama used when `model.path` is not set."""

    num_layers: int = Field(2, ge=1, description="transformer layers of the tiny model")
    hidden_size: int = Field(128, ge=8, description="hidden width of the tiny model")
    num_heads: int = Field(4, ge=1, description="attention heads of the tiny model")
    intermediate_size: int = Field(512, ge=8, description="MLP width of the tiny model")


class WarmStartConfig(_Section):
    """Short deterministic SFT so RL starts from a policy that is sometimes right."""

    enabled: bool = Field(
        True, description="warm-start the tiny model by SFT (false: RL from random weights)"
    )
    steps: int = Field(600, ge=0)  # phase 1: SFT on correct answers
    batch_size: int = Field(64, ge=1, description="SFT batch size of the tiny warm start")
    lr: float = Field(3e-3, gt=0, description="SFT learning rate of phase 1 (correct answers)")
    # Phase 2: SFT on a teacher that forgets each carry with probability
    # `teacher_carry_error`: a systematic, fixable mistake (like a base model's), so the
    # policy is sometimes right and RL has something real to correct.
    mistake_steps: int = Field(150, ge=0)
    mistake_lr: float = Field(1e-3, gt=0, description="SFT learning rate of phase 2 (the teacher)")
    teacher_carry_error: float = Field(
        0.8, ge=0, le=1, description="phase 2: chance the teacher forgets each carry"
    )
    seed: int = Field(1234, description="seed of the warm start's init and data")


class LoraConfig(_Section):
    """LoRA adapters via `peft` (the `lora` extra): only the adapters are trained, and the KL
    reference is the base model with the adapters disabled (no second copy)."""

    enabled: bool = Field(False, description="train LoRA adapters only (TRL's peft_config)")
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: int = Field(16, ge=1)  # scaling = alpha / r
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    target_modules: list[str] = Field(
        ["q_proj", "v_proj"], description="module names that get adapters"
    )

    @model_validator(mode="after")
    def _needs_targets(self) -> LoraConfig:
        if self.enabled and not self.target_modules:
            raise ValueError("model.lora.target_modules must name at least one module")
        return self


class SFTWarmupConfig(_Section):
    """A short supervised warm-up of a pretrained model (`model.path`) on the task's own
    answers before RL (full fine-tuning, fp32), built once per config and cached like the tiny
    model's warm start. For a model that can do the task but not in the reward's format (an
    instruct model that never writes reasoning-gym's `<answer>` tags): SFT first, then RL, as
    the papers' runs start from SFT models. Off (0 steps) by default."""

    steps: int = Field(
        0, ge=0, description="supervised warm-up steps of model.path before RL (0 = none)"
    )
    batch_size: int = Field(8, ge=1, description="supervised warm-up batch size")
    lr: float = Field(2e-5, gt=0, description="supervised warm-up learning rate")
    # the teacher's answer is replaced by a near miss with this probability (the task's
    # `sft_completion`), so the start policy is sometimes right and has mistakes RL can fix
    teacher_error: float = Field(0.0, ge=0, le=1)
    # forward/backward under CPU autocast (fp32 master weights); bf16 is ~2x faster on CPUs
    # with AVX-512 BF16 and the warm-up is a starting point, not a measured result
    autocast: Literal["none", "bfloat16"] = "bfloat16"
    # > 0: train LoRA adapters of this rank on every linear layer, then merge them into the
    # weights (much faster on CPU: no full-size optimizer state); 0: full fine-tuning
    lora_r: int = Field(16, ge=0)
    seed: int = Field(1234, description="seed of the supervised warm-up")


class ModelConfig(_Section):
    # a local HF folder, a model prepared by `replayrl prepare` (e.g. smollm2-135m), or a hub
    # id (needs a network); None = the built-in tiny model
    path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the policy's weights (a model object: its own)"
    )
    # recompute activations in backward (less memory); on by default under
    # train.sharding=fsdp unless set here
    gradient_checkpointing: bool = False

    @field_validator("dtype")
    @classmethod
    def _no_fp16_weights(cls, value: str) -> str:
        # fp16 master weights and gradients underflow without a loss scaler (not run here)
        if value == "float16":
            raise ValueError(
                "model.dtype=float16 would train float16 weights without a loss scaler, so "
                "small gradients and updates underflow to zero: use model.dtype=bfloat16 "
                "(float32's range) or float32 with precision.learner_autocast=bfloat16"
            )
        return value

    # Llama-architecture policies: the learner's lean training forward (shared prompts run
    # once); false = transformers' own forward (same values, more time and memory)
    lean_forward: bool = True
    lora: LoraConfig = LoraConfig()
    tiny: TinyModelConfig = TinyModelConfig()
    warmstart: WarmStartConfig = WarmStartConfig()  # the built-in tiny model's
    sft: SFTWarmupConfig = SFTWarmupConfig()  # a pretrained model's (model.path)


class PrecisionConfig(_Section):
    """Numeric precision of generation and learning (BENCHMARKS.md: speed and log-prob
    mismatch per setting). Master weights stay in `model.dtype`."""

    # dtype the generator samples in; bfloat16 with float32 weights samples from a bf16 copy
    # refreshed at every generation. auto = bfloat16 where the hardware computes it natively
    # (CPU flags + a timed self-check cached per machine, models/precision.py) for float32
    # models of >= 20M parameters, else model.dtype: bf16 is ~2x faster with AVX-512 BF16/AMX
    # but ~1.5-2.6x slower where it is emulated (BENCHMARKS.md, speed per machine)
    generation: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # learner forward/backward under torch.autocast to this dtype (fp32 master weights);
    # auto = bfloat16 under the same hardware test as `generation`, else none
    learner_autocast: Literal["auto", "none", "bfloat16"] = "auto"
    # oneDNN fp32 matmul kernels on CPU (kept only where a self-check shows fp32 accuracy)
    fast_fp32_matmul: bool = True
    # learner recomputes log pi_old of fresh rollouts in its own precision (ratio exactly 1
    # before the first update); auto = when generation or learner precision is reduced
    recompute_behaviour_logprobs: Literal["auto", "always", "never"] = "auto"
    # truncated importance sampling (Yao et al. 2025; algorithms/correction.py): each token's
    # loss weighted by min(pi_learner_old / pi_sampler, C) with this C (the paper uses 2), to
    # correct for tokens drawn by a reduced-precision sampler; needs the learner's own log
    # pi_old (recompute_behaviour_logprobs active); null = off
    truncated_is_cap: float | None = Field(None, gt=0)
    # how that cap (or vllm.truncated_is_cap) applies, TRL's vllm_importance_sampling_mode:
    # the ratio per token or per sequence (product of its tokens'), truncated at C or masked
    # (weight 0) past it; algorithms/correction.py
    importance_sampling_mode: Literal[
        "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = Field("token_truncate", description="truncated IS: per token/sequence, truncate/mask")

    @field_validator("learner_autocast", mode="before")
    @classmethod
    def _no_fp16_learner(cls, value: Any) -> Any:
        # fp16 gradients underflow without a loss scaler, which the learner does not run
        if value in ("float16", "fp16", "half"):
            raise ValueError(
                "float16 autocast needs a gradient scaler, which the learner does not run: "
                "use precision.learner_autocast=bfloat16 (same speed on GPUs that have it, "
                "float32's range) or none"
            )
        return value


class TaskConfig(_Section):
    """The task (`task.name`, a `TASKS` name), the settings every task has, and the selected
    task's own section (`task.reasoning`, `task.dataset`, ...), validated by the model its
    task declares next to its code (config/task_sections.py)."""

    model_config = ConfigDict(extra="allow")

    # arithmetic: the built-in generated task; dataset: rows from a local file;
    # reasoning: built-in written-out arithmetic (long traces, final answer after `#`);
    # reasoning_gym: reasoning-gym's generated tasks
    name: str = Field(
        "arithmetic",
        description="the task (a `TASKS` registry name: arithmetic, dataset, reasoning, "
        "reasoning_gym, or one a plugin registers); its settings are under task.<name>",
    )
    eval_size: int = Field(200, ge=0)  # 0: none held out (no evaluation but a dataset.eval_path)
    seed: int = Field(0, description="seed of the eval split and generated tasks")
    # render prompts with the tokenizer's chat template when it has one (see prompts.py)
    chat_template: bool = True
    system_prompt: str | None = None  # put first in every prompt (unless a row has its own)

    @model_validator(mode="before")
    @classmethod
    def _task_section(cls, data: Any) -> Any:
        """The selected task's section under its name; old flat keys moved into it."""
        return place_task_keys(data, cls.model_fields, "arithmetic")

    @model_validator(mode="after")
    def _task_checks(self) -> TaskConfig:
        """The named task's own rules (its registry entry's `check`)."""
        spec = TASKS.get(self.name)
        if spec.check is not None:
            spec.check(self)
        return self

    @property
    def settings(self) -> Any:
        """The selected task's own section (`task.<name>`; None if it declares none)."""
        return (self.model_extra or {}).get(self.name)

    def flat(self) -> dict[str, Any]:
        """The common settings and the selected task's own, in one dict by name (as the
        flat section held them: hashes over it stay the same for the same settings)."""
        out = {k: getattr(self, k) for k in type(self).model_fields}
        settings = self.settings
        return out | (settings.model_dump() if settings is not None else {})


class RewardSpec(_Section):
    name: str  # a registered name (`REWARDS`: "correctness", ...) or file.py:function
    weight: float = 1.0

    @field_validator("name")
    @classmethod
    def _registered_reward(cls, v: str) -> str:
        # file.py:function and package.module:function are loaded when the run starts; a
        # non-name (the API's "<not replayable ...>" record of a lambda) is refused there
        # unless the function itself is passed again
        return REWARDS.check(v) if v.isidentifier() else v


class RolloutConfig(_Section):
    @model_validator(mode="before")
    @classmethod
    def _renamed_decode_batch_size(cls, data: Any) -> Any:
        """`generation_batch_size` is read as `decode_batch_size`, with a warning, so that
        configs that use it keep running; both at once are refused (TRL's generation_batch_size
        is the completions per step, which would make the name ambiguous)."""
        if not isinstance(data, dict) or "generation_batch_size" not in data:
            return data
        if "decode_batch_size" in data:
            raise ValueError(
                "rollout.generation_batch_size is the old name of rollout.decode_batch_size: "
                "give only decode_batch_size"
            )
        warnings.warn(
            "rollout.generation_batch_size is now rollout.decode_batch_size (sequences decoded "
            "at once); the old name is read this time",
            stacklevel=2,
        )
        data = dict(data)
        data["decode_batch_size"] = data.pop("generation_batch_size")
        return data

    prompts_per_step: int = Field(
        16, ge=1, description="prompts per step; R = prompts_per_step x num_generations"
    )
    num_generations: int = Field(8, ge=1)  # group size G
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens (0: all)")
    min_p: float = Field(
        0.0, ge=0, le=1, description="drop tokens below min_p x the top token's probability"
    )
    repetition_penalty: float = Field(
        1.0, gt=0, description="logits of tokens already in prompt or completion: / (or x) this"
    )
    max_new_tokens: int = Field(
        8, ge=1, description="completion length cap (TRL: max_completion_length)"
    )
    # sequences decoded at once (memory only; not TRL's generation_batch_size, which is the
    # completions per step R); a config's generation_batch_size is read as this, with a warning
    decode_batch_size: int = Field(256, ge=1, description="sequences decoded at once (memory only)")
    # seconds one reward-function call may take before its rollouts are dropped (reason
    # "timeout"; the call is abandoned in a background thread); null: no timeout
    reward_timeout_s: float | None = Field(60.0, gt=0)
    # process: each reward function of yours (file.py:fn, module:fn, a Python callable) runs
    # in a forked worker process, so os._exit, a crash, a hang or a stray thread in it cannot
    # end or hang the run (a timeout kills the worker); thread: in the trainer's process (a
    # function that must share state with it, or use its CUDA context). Built-ins: in-process
    reward_isolation: Literal["process", "thread"] = "process"
    # hf: transformers generate (CPU/GPU); vllm: GPU engine (the `vllm` extra; see `vllm`);
    # or a backend a plugin registers (`BACKENDS`)
    backend: str = "hf"
    # backend hf: fast = own decode loop (one prefill per prompt, inverse-CDF sampling, an
    # in-place KV cache for Llama-architecture models; ~2-3x); fast_hf = the same loop over
    # transformers' own forward and cache (what fast does for other architectures);
    # generate = transformers generate + torch.multinomial (other random draws than fast's:
    # select it to reproduce the runs made with it, such as BENCHMARKS.md's default suite)
    generation_impl: Literal["fast", "fast_hf", "generate"] = "fast"

    @field_validator("backend")
    @classmethod
    def _registered_backend(cls, v: str) -> str:
        return BACKENDS.check(v)

    @model_validator(mode="after")
    def _filters_on_own_engines(self) -> RolloutConfig:
        # an engine with its own sampler (vLLM) returns the log-probs of the filtered
        # distribution, not the tempered policy's that the learner recomputes (as top_p < 1)
        used = [
            f"{k}={v}"
            for k, v, off in (
                ("top_k", self.top_k, 0),
                ("min_p", self.min_p, 0.0),
                ("repetition_penalty", self.repetition_penalty, 1.0),
            )
            if v != off
        ]
        if used and BACKENDS.get(self.backend).own_logprobs:
            raise ValueError(
                f"rollout.backend={self.backend} with {', '.join(used)}: its engine's "
                "log-probs are then those of the filtered distribution, not the policy's the "
                "learner assumes; use rollout.backend=hf"
            )
        return self


class BufferConfig(_Section):
    """The buffer the method's rollouts go through; its kind (onpolicy: the freshest,
    removed once trained on; replay: a FIFO of N sampled each step, arXiv 2604.08706) is
    the method's (`MethodSpec.buffer`)."""

    capacity: PositiveInt | Literal["auto"] | None = Field(
        None,
        description="N, rollouts kept; staleness horizon x = N / R (R generated per step). "
        "None: unbounded (on-policy methods only); auto (experimental): x* from `replayrl "
        "design` on a measured warm-up",
    )
    sampler: str = Field(
        "uniform",
        description="uniform, or positive_bias: a share delta of each batch drawn from "
        "rewarded rollouts (arXiv 2604.08706); or a sampler a plugin registers",
    )
    delta: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="positive_bias: the share delta of each batch drawn from rewarded "
        "rollouts (0: uniform replay; the benchmarked setting is 0.2)",
    )
    with_replacement: bool = Field(False, description="sample a batch with replacement")
    num_shards: int = Field(1, ge=1, description="buffer shards (one per data-parallel learner)")
    max_staleness: int | None = Field(
        None, ge=0, description="drop rollouts older than this many policy versions; None: keep"
    )
    # paper 1's ratios (arXiv 2604.08706): an explicit capacity / train.batch_size wins over
    # them, with a warning when it is more than 2x from the ratio's intent
    staleness_horizon: float | None = Field(
        None,
        gt=0,
        description="x = N / R: N = round(x R) for this run's R, so a preset scales with the "
        "batch (unset: use capacity)",
    )
    replay_ratio: float | None = Field(
        None,
        gt=0,
        description="y = B / R, average uses per rollout: train.batch_size = round(y R) when unset",
    )

    @field_validator("sampler")
    @classmethod
    def _registered_sampler(cls, v: str) -> str:
        return SAMPLERS.check(v)


RATIO_TOLERANCE = 2.0  # resolved x or y more than this factor from the set ratio: warn


def resolve_ratios(cfg: Config) -> None:
    """Fill buffer.capacity / train.batch_size from buffer.staleness_horizon / replay_ratio
    (N = round(x R), B = round(y R), at least 1) where they are unset, and warn when the
    resolved x = N/R or y = B/R is far from the ratio asked for (an absolute N or B that does
    not scale with R, or rounding at a small R). `auto` is left to the run's design."""

    b, r = cfg.buffer, cfg.rollouts_per_step
    pairs = (("staleness_horizon", "buffer.capacity"), ("replay_ratio", "train.batch_size"))
    for key, target in pairs:
        want = getattr(b, key)
        section, field = target.split(".")
        owner = getattr(cfg, section)
        have = getattr(owner, field)
        if want is None or have == "auto":
            continue
        if have is None:
            setattr(owner, field, max(1, math.floor(want * r + 0.5)))
            have = getattr(owner, field)
        got = have / r
        if got > want * RATIO_TOLERANCE or got < want / RATIO_TOLERANCE:
            warnings.warn(
                f"{target}={have} with R = {r} rollouts per step gives {got:.3g} = "
                f"{'N' if section == 'buffer' else 'B'}/R, more than {RATIO_TOLERANCE:g}x from "
                f"buffer.{key}={want:g}: unset {target} to derive it from the ratio",
                UserWarning,
                stacklevel=2,
            )


# what `measured` alpha / rho fall back to when the warm-up cannot measure them (logged)
DESIGN_FALLBACK = {"alpha": 0.25, "rho": 0.5}


class DesignConfig(_Section):
    """Inputs of paper 1's cost model, used when capacity or batch size is `auto`
    (experimental: replayrl/run/loops/auto.py measures them on the run's warm-up)."""

    # power-law exponent of sigma(x) and correlation between buffer items: a number, or
    # `measured` on the warm-up's per-sample gradients at staleness 0 .. warmup_steps
    # (replayrl/design/staleness.py; DESIGN_FALLBACK, logged, when that is ill-conditioned)
    alpha: Annotated[float, Field(ge=0, lt=0.5)] | Literal["measured"] = "measured"
    rho: Annotated[float, Field(ge=0, le=1)] | Literal["measured"] = Field(
        "measured",
        description="correlation between buffer items (paper 1's rho): a number or measured",
    )
    # generation / training cost per rollout: `measured` on the warm-up's timed steps, or a
    # number to design for another machine than this one (e.g. paper 1's GPU figure 5.3 on a
    # CPU where generation is cheap); the measured value is recorded either way
    mu: Annotated[float, Field(gt=0)] | Literal["measured"] = "measured"
    warmup_steps: int = Field(2, ge=1)  # measured steps to estimate mu (and alpha, rho)
    # alpha / rho measured: batches generated at each warm-up policy and at the last one only
    # for their per-sample gradients, never trained on (an update shrinks the gradients of
    # the batch it took, median 0.13x: run/loops/probe.py); more batches, less noise, more cost
    probe_batches: int = Field(1, ge=1)
    # the feasible set `auto` searches: N >= R always; B >= R unless this is true
    allow_y_below_one: bool = False
    # B > N: a batch repeating rollouts within one update (paper 1's J credits it; see
    # design/theory.py feasible_design); false keeps B <= N
    allow_b_above_n: bool = False
    # predicted compute saving (vs on-policy) below which `auto` stays on-policy (N = B = R)
    min_saving: float = Field(0.05, ge=0, lt=1)
    # alpha / rho `measured` but not measurable on the warm-up (no signal, too few groups):
    # false stays on-policy, true reuses on the DESIGN_FALLBACK guesses (on three held-out
    # tasks at mu = 5.3 that design, N = R, B = 1.9 R, ended below GRPO: BENCHMARKS.md)
    reuse_on_fallback: bool = False
    # alpha / rho measured: reuse only when the chosen buffer saves >= min_saving in at least
    # this share of `bootstrap` re-estimates on half-samples of the warm-up's prompt groups
    # (design/staleness.py bootstrap_alpha_rho; the fit on three staleness levels is noisy);
    # 0 trusts the point estimate
    confidence: float = Field(0.9, ge=0, le=1)
    bootstrap: int = Field(
        200, ge=1, description="half-sample re-estimates of alpha, rho behind `confidence`"
    )


class AlgorithmConfig(_Section):
    # names registered in replayrl.algorithms (POLICY_LOSSES, AGGREGATIONS, ADVANTAGES):
    # a loss registered before the config is built is accepted like a built-in one
    loss_type: str = "grpo_clip"  # grpo_clip | asymre | mix_ppg | ...
    epsilon: float = Field(0.2, ge=0, description="PPO clip range of the ratio (low side)")
    epsilon_high: float | None = Field(None, ge=0)  # None: same as epsilon
    # token_mean | seq_mean | dr_grpo (sum / (B * rollout.max_new_tokens), a constant)
    loss_agg: str = "token_mean"
    scale_rewards: bool = True  # False = Dr.GRPO (no std normalisation)
    asymre_delta_v: float = Field(-0.1, description="AsymRE baseline shift (loss_type=asymre)")
    # grpo (group-relative) | rloo (leave-one-out, arXiv 2402.14740): stored at generation;
    # gae: PPO with a critic (`critic`), per step; replayrl.algorithms.advantages.ADVANTAGES
    advantage: str = "grpo"
    entropy_coef: float = Field(0.0, ge=0)  # entropy bonus c (ReMix: 0.001)
    mask_truncated_completions: bool = Field(
        False,
        description="completions that hit rollout.max_new_tokens without EOS add no term to the "
        "policy loss (TRL's mask_truncated_completions; DAPO's overlong filtering, arXiv "
        "2503.14476); their group's advantages still count them",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: a ratio per token; sequence: GSPO's ratio exp(mean of a "
        "completion's token log-ratios) for all its tokens (arXiv 2507.18071; loss grpo_clip)",
    )

    @model_validator(mode="after")
    def _sequence_level_loss(self) -> AlgorithmConfig:
        """GSPO's sequence ratio needs a loss that reads the level (its registered knobs)."""
        from replayrl.algorithms import POLICY_LOSSES  # lazy: torch

        if self.importance_sampling_level == "sequence":
            knobs = POLICY_LOSSES.get(self.loss_type).knobs
            if "importance_sampling_level" not in knobs:
                takes = sorted(
                    n
                    for n in POLICY_LOSSES
                    if "importance_sampling_level" in POLICY_LOSSES.get(n).knobs
                )
                raise ValueError(
                    "algorithm.importance_sampling_level=sequence (GSPO) is implemented for "
                    f"loss_type {', '.join(takes)} only (got {self.loss_type})"
                )
        return self

    @field_validator("loss_type")
    @classmethod
    def _registered_loss(cls, v: str) -> str:
        from replayrl.algorithms import POLICY_LOSSES

        return POLICY_LOSSES.check(v)

    @field_validator("loss_agg")
    @classmethod
    def _registered_agg(cls, v: str) -> str:
        from replayrl.algorithms import AGGREGATIONS

        return AGGREGATIONS.check(v)

    @field_validator("advantage")
    @classmethod
    def _registered_advantage(cls, v: str) -> str:
        from replayrl.algorithms import ADVANTAGES

        return ADVANTAGES.check(v)


class KLScheduleConfig(_Section):
    """lambda(t) = max(1 - decrement * ceil(max(t - start, 0) / every), floor) (paper 2)."""

    start: int = Field(50, ge=0, description="step after which lambda(t) starts to fall")
    every: int = Field(10, ge=1, description="lambda(t) falls once every this many steps")
    decrement: float = Field(0.1, ge=0, le=1, description="how much lambda(t) falls each time")
    floor: float = Field(0.5, ge=0, le=1, description="lambda(t) never falls below this")


class KLConfig(_Section):
    beta: float = Field(0.0, ge=0)  # 0 = no KL term (and no frozen copies kept)
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator per token")
    # reference: KL(pi || pi_ref), pi_ref = the initial policy;
    # convex: ReMix's lambda KL(pi || pi_base) + (1 - lambda) KL(pi || pi_{k-1})
    target: Literal["reference", "convex"] = Field(
        "reference",
        description="reference: KL to the initial policy; convex: ReMix's KL-Convex, lambda KL "
        "to pi_base + (1 - lambda) KL to the previous policy (arXiv 2507.06892)",
    )
    schedule: KLScheduleConfig = KLScheduleConfig()


class MethodConfig(_Section):
    """The reuse method (`method.name`, a `METHODS` name) and every registered method's own
    section (`method.remix`, `method.exgrpo`, ...), each validated by the model its method
    declares (`replayrl.methods`). Older configs' `remix`, `groups` and `buffer.kind` keys
    are moved here on reading (config/method_sections.py)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(
        DEFAULT_METHOD,
        description="the reuse method: onpolicy (GRPO/PPO), replay (arXiv 2604.08706), remix "
        "(arXiv 2507.06892), dynamic_sampling (DAPO), group_replay, ar3po, exgrpo, repo, or "
        "one a plugin registers; its settings are under method.<name>",
    )

    @model_validator(mode="before")
    @classmethod
    def _registered_sections(cls, data: Any) -> Any:
        """Check the method's name, and validate each registered method's section (its
        defaults where not given); a section no method owns is an unknown key."""
        if isinstance(data, BaseModel):
            data = data.model_dump()
        data = dict(data or {})
        METHODS.check(str(data.get("name", DEFAULT_METHOD)))
        for key in data:
            if key != "name" and key not in METHODS:
                raise ValueError(
                    f"method.{key}: no method of that name has settings "
                    f"(registered: {', '.join(METHODS)})"
                )
        for name in METHODS:
            section = METHODS.get(name).config
            if section is None:
                continue
            given = data.get(name, {})
            try:
                data[name] = given if isinstance(given, section) else section.model_validate(given)
            except ValidationError as exc:
                raise ValueError(nested_errors(f"method.{name}", exc)) from None
        return data

    def section(self, name: str) -> Any:
        """The validated section of method `name` (None if it declares none)."""
        return (self.model_extra or {}).get(name)

    @property
    def settings(self) -> Any:
        """The selected method's own section (None if it declares none)."""
        return self.section(self.name)


def section_fields(model: type[BaseModel]) -> dict[str, Any]:
    """A section's sub-fields by name -> annotation (a model for nested sections), with the
    registered methods' own sections under `method`, the tasks' under `task`, and the
    backends' and runtimes' at the top level."""
    fields: dict[str, Any] = {n: f.annotation for n, f in model.model_fields.items()}
    if model is Config:
        fields |= owned_sections()
    registry: Any = {MethodConfig: METHODS, TaskConfig: TASKS}.get(model)
    for name in registry or ():
        section = registry.get(name).config
        if section is not None:
            fields[name] = section
    return fields


class CriticConfig(_Section):
    """PPO's value model (used when algorithm.advantage = gae)."""

    lr: float = Field(1e-5, gt=0, description="critic learning rate")
    value_clip: float | None = Field(
        0.5, gt=0, description="clip of the value update around the old value (None: off)"
    )
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount gamma")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    warmup_steps: int = Field(0, ge=0)  # critic-only updates before the policy moves


class TrainConfig(_Section):
    steps: int = Field(80, ge=0, description="learner steps (each generates, then trains)")
    # rollouts per step's batch B; None = R; "auto" (experimental) = from `replayrl design`
    # on a measured warm-up (see `design`);
    # the replay ratio y = B / R
    batch_size: PositiveInt | Literal["auto"] | None = None
    mini_batch_size: int | None = Field(None, ge=1)  # rollouts per optimizer update; None = B
    epochs: int = Field(1, ge=1)  # passes over each batch (update-to-data ratio)
    micro_batch_size: int = Field(64, ge=1)  # memory only: gradient accumulation chunk
    # memory only: micro-batches packed to at most this many padded tokens (rows x longest
    # prompt + completion), at most micro_batch_size rows each (verl's dynamic batch size);
    # None = micro_batch_size rows each
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    lr: float = Field(1e-4, gt=0, description="policy learning rate (peak, after warm-up)")
    # learning-rate schedule over train.steps learner steps (torch LambdaLR in the learner):
    # constant (the presets), linear decay to 0 (TRL's default) or cosine, after a linear
    # warm-up of warmup_steps (or warmup_ratio * steps, rounded up) steps
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps (0: warmup_ratio)")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="warm-up as a share of steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping; None: off")
    seed: int = Field(0, description="seed of sampling, shuffling and the model's init")
    threads: int | None = Field(None, ge=1)  # torch intra-op threads; None = torch default
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="where the policy, frozen KL policies, critic, batches, generation and "
        "evaluation run: auto (cuda when available, else cpu), cpu, cuda or cuda:N",
    )
    # learner log-probs: chunked = completion positions only, output head in chunks (less
    # memory, faster); full = full-vocabulary logits of every position, the reference the
    # chunked one is tested against (rounding differs at ~1e-7: select it to reproduce runs
    # made with it bit for bit)
    logprobs_impl: Literal["chunked", "full"] = "chunked"
    sharding: Literal["none", "fsdp"] = Field(
        "none",
        description="fsdp = the policy, its gradients and AdamW state sharded across the "
        "learner ranks with FSDP2 (runtime=ray, workers.learners >= 2; not with "
        "kl.target=convex); with model.lora.enabled the frozen base is sharded too and AdamW "
        "holds the adapters only; kl.beta > 0's reference policy is sharded the same "
        "way; none = every learner holds the whole policy (data-parallel)",
    )
    sharding_param_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="train.sharding=fsdp: the dtype sharded parameters are gathered and "
        "computed in (gradients are reduced in fp32, AdamW keeps fp32 master weights); auto = "
        "bfloat16 on CUDA, float32 on CPU",
    )
    sharding_replicas: int = Field(
        1,
        ge=1,
        description="train.sharding=fsdp: HSDP, the learner ranks split into this many "
        "replicas (e.g. one per node), each sharding the policy over its ranks; 1 = every "
        "rank holds 1 / workers.learners of it",
    )
    preflight: Literal["error", "warn", "off"] = Field(
        "error",
        description="before a run loads weights on a GPU, `replayrl plan`'s per-GPU learner "
        "estimate is compared with the learner GPU's free memory: error = refuse a run that "
        "does not fit (naming the knobs that would make it fit), warn = log it and start, "
        "off = skip; CPU runs and models without a local config.json are not checked",
    )

    @field_validator("preflight", mode="before")
    @classmethod
    def _preflight_off(cls, value: Any) -> Any:
        # YAML reads a bare `off` (train.preflight=off) as false
        return "off" if value is False else value

    # no silent non-training: this many steps in a row in which nothing could be trained (a
    # reward function failed on every call, every update was skipped as non-finite, or the
    # gradient was exactly 0 despite non-zero advantages) end the run with an error; 0 = never
    failure_patience: int = Field(3, ge=0)
    rollout_budget: int | None = Field(
        None,
        ge=1,
        description="stop once this many rollouts were generated (train.steps stays an upper "
        "bound); None = train.steps x R. Compares methods that generate different numbers "
        "per step (ReMix's fixed composition) at one generated budget",
    )


class EvalConfig(_Section):
    every: int = Field(10, ge=0)  # steps between evals; 0 = only at start and end
    every_rollouts: int | None = Field(
        None,
        ge=1,
        description="evaluate after each step that crosses a multiple of this many generated "
        "rollouts, instead of every `every` steps (a grid in rollouts for runs whose steps "
        "generate different numbers: ReMix's fixed composition)",
    )
    num_prompts: int | None = Field(None, ge=1)  # None = the whole eval split
    pass_k: int = Field(0, ge=0)  # >1: also pass@k at `temperature`
    temperature: float = Field(1.0, gt=0, description="sampling temperature of pass@k")
    batch_size: int = Field(256, ge=1, description="sequences decoded at once in evaluation")


class LoggingConfig(_Section):
    run_dir: str = Field("runs", description="parent folder of run folders")
    name: str = Field("demo", description="run folder name (TRL: output_dir = run_dir/name)")
    overwrite: bool = False  # replace an existing run folder of the same name
    tensorboard: bool = Field(True, description="write TensorBoard events")
    # Weights & Biases (the `wandb` extra), beside JSONL and TensorBoard, with the same metric
    # names and the run config; WANDB_MODE=offline works without an account or network
    wandb: bool = False
    wandb_project: str = Field("replayrl", description="W&B project")
    wandb_entity: str | None = Field(None, description="W&B entity (user or team)")
    progress: bool = Field(True, description="progress bar")
    # a completion containing any of these counts toward `reflection_rate` (paper 2's finding)
    reflection_words: list[str] = ["wait", "check", "verify", "let me"]
    # warn after this many consecutive steps without reward variance (signal.py)
    no_signal_patience: int = Field(5, ge=1)
    completions: int = Field(
        4,
        ge=0,
        description="completions written to completions.jsonl (and TensorBoard / W&B, and "
        "printed with the progress bar) per logged step: prompt, completion, rewards, "
        "advantage, trained or not, fresh or replayed; 0 = off (TRL: log_completions, "
        "num_completions_to_print)",
    )
    completions_every: int = Field(
        10, ge=1, description="log completions at step 1 and every this many steps after"
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        # the run folder is run_dir/name, and overwrite replaces it: "." would be run_dir
        # itself, "../x" a sibling of it; leading dots are the hidden aside/lock files
        bad = not v or v.startswith(".") or any(c in v for c in "/\\\0") or v != v.strip()
        if bad or len(v.encode()) > 200:
            raise ValueError(
                f"logging.name must be a plain folder name (no '/', no leading '.', not "
                f"empty, at most 200 bytes), got {v!r}: put parent folders in logging.run_dir"
            )
        return v


class CheckpointConfig(_Section):
    every: int = Field(0, ge=0)  # steps between checkpoints; 0 = only at the end
    keep_last: int = Field(2, ge=1, description="checkpoints kept (older ones deleted)")


class WorkersConfig(_Section):
    """Asynchronous runtimes: W generator workers and T learners running concurrently."""

    generators: int = Field(1, ge=1)  # W
    learners: int = Field(1, ge=1)  # T (data parallel; each samples its own buffer shard)
    sync_every: int = Field(1, ge=1)  # k: generators get new weights every k learner steps
    # bound on learner version - rollout version for every trained rollout; None = unbounded
    max_staleness: int | None = Field(None, ge=0)
    # drop: stale rollouts are removed from the buffer (counted); wait: also pause the learner
    # until generators deliver rollouts within the bound (fewer drops, less learner overrun)
    on_stale: Literal["drop", "wait"] = "drop"
    # uses of each generated rollout the learner may not exceed (trained / received);
    # auto = B / R, the synchronous loop's replay ratio; None = train as fast as possible
    replay_ratio: float | Literal["auto"] | None = "auto"
    generator_threads: int = Field(1, ge=1)  # torch threads per generator worker
    max_pending_batches: int = Field(4, ge=1)  # backpressure: undelivered batches per worker
    max_restarts: int = Field(3, ge=0)  # per worker, before the run fails
    startup_timeout: float = Field(600.0, gt=0)  # seconds for a worker to load its model


class Config(_Section):
    """A whole run's settings. Besides the sections below, the top-level sections that the
    registered generation backends and runtimes declare (`vllm`, `ray`; `owned_sections`),
    validated by their own models and read with `section`."""

    model_config = ConfigDict(extra="allow")

    # sync: one process, generate then train; async-local: generator processes on this
    # machine train concurrently with the learner; ray: generators, buffer, learners as actors
    # (or a runtime a plugin registers: `RUNTIMES`)
    runtime: str = "sync"
    model: ModelConfig = ModelConfig()
    task: TaskConfig = Field(default_factory=TaskConfig)  # checked against TASKS per config
    rewards: list[RewardSpec] = Field(
        [RewardSpec(name="correctness", weight=1.0)],
        description="reward functions and weights: built-in names or file.py:function / "
        "package.module:function",
    )
    rollout: RolloutConfig = RolloutConfig()
    buffer: BufferConfig = BufferConfig()
    design: DesignConfig = DesignConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    kl: KLConfig = KLConfig()
    # built per config: its registered sections load with the first config, not on import
    method: MethodConfig = Field(default_factory=MethodConfig)
    critic: CriticConfig = CriticConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    workers: WorkersConfig = WorkersConfig()
    precision: PrecisionConfig = PrecisionConfig()

    @property
    def rollouts_per_step(self) -> int:
        """R: rollouts generated each step."""
        return self.rollout.prompts_per_step * self.rollout.num_generations

    @property
    def batch_size(self) -> int:
        """B: rollouts in each step's training batch (R when unset; resolve `auto` first)."""
        b = self.train.batch_size
        if b == "auto":
            raise ValueError("train.batch_size=auto is resolved at the start of a run")
        return b or self.rollouts_per_step

    @property
    def needs_design(self) -> bool:
        return self.buffer.capacity == "auto" or self.train.batch_size == "auto"

    @field_validator("runtime")
    @classmethod
    def _registered_runtime(cls, v: str) -> str:
        return RUNTIMES.check(v)

    @model_validator(mode="before")
    @classmethod
    def _method_section(cls, data: Any) -> Any:
        """The method's keys in `method` (older configs' remix, groups, buffer.kind moved),
        and the backends' and runtimes' own sections validated (their defaults where not
        given); a top-level key that neither the schema nor a registered entry declares is
        an error."""
        data = place_method_keys(data)
        if not isinstance(data, dict):
            return data
        owned = owned_sections()
        taken = sorted(set(owned) & set(cls.model_fields))
        if taken:
            raise TypeError(
                f"a registered backend or runtime declares the config section {taken[0]!r}, "
                "which the schema already has: give its section another name"
            )
        for key in data:
            if key not in cls.model_fields and key not in owned:
                raise ValueError(
                    f"{key}: Extra inputs are not permitted (the config's sections: "
                    f"{', '.join([*cls.model_fields, *owned])})"
                )
        for name, model in owned.items():
            given = data.get(name, {})
            try:
                data[name] = given if isinstance(given, model) else model.model_validate(given)
            except ValidationError as exc:
                raise ValueError(nested_errors(name, exc)) from None
        return data

    def section(self, name: str, model: type[SectionT]) -> SectionT:
        """The top-level section `name` that a backend or runtime declares, as `model`."""
        value = (self.model_extra or {}).get(name)
        if not isinstance(value, model):
            raise KeyError(f"the config has no section {name!r} of type {model.__name__}")
        return value

    @property
    def method_spec(self) -> Any:
        """The selected method's registry entry (`MethodSpec`)."""
        return METHODS.get(self.method.name)

    @model_validator(mode="after")
    def _check_batches(self) -> Config:
        self._check_buffer()  # what the method's kind of buffer can hold, first
        if (self.buffer.capacity == "auto") != (self.train.batch_size == "auto"):
            # the design picks N and B jointly; with one fixed it would report a design
            # (even "stay on-policy") other than the run
            raise ValueError(
                "buffer.capacity=auto and train.batch_size=auto go together (paper 1's design "
                "picks N and B jointly): set both to auto, or neither"
            )
        resolve_ratios(self)  # N, B from x, y first: every check below sees integers
        mini = self.train.mini_batch_size
        if self.train.batch_size != "auto" and mini is not None and mini > self.batch_size:
            raise ValueError(
                f"train.mini_batch_size={mini} is larger than the batch size B={self.batch_size}: "
                "lower train.mini_batch_size (with a model.path it defaults to TRL's 8 "
                "completions per update) or generate more per step"
            )
        if self.train.sharding == "fsdp":
            self._check_sharding()
        lockstep = RUNTIMES.get(self.runtime).lockstep
        if self.train.rollout_budget is not None and not lockstep:
            raise ValueError(
                f"train.rollout_budget needs {runtimes_with('lockstep')} (got {self.runtime})"
            )
        if not self.rewards:
            raise ValueError("rewards: at least one reward function is needed")
        self._check_loss_requirements()
        self._check_method()
        backend_check = BACKENDS.get(self.rollout.backend).check
        if backend_check is not None:
            backend_check(self)  # the generation backend's own rules, next to its code
        self._check_signal()  # after the method's checks: theirs name the cause more precisely
        if not lockstep:
            self._check_async()
        return self

    def _check_buffer(self) -> None:
        """The buffer settings its kind (the method's) can hold."""
        if self.method_spec.buffer == "replay":
            b = self.buffer
            if b.capacity is None and b.staleness_horizon is None:
                raise ValueError(
                    f"buffer.capacity (or buffer.staleness_horizon) must be set for "
                    f"method.name={self.method.name} (a replay buffer)"
                )
            return
        why = f"method.name=replay (a replay buffer; got {self.method.name})"
        if self.buffer.capacity == "auto":
            raise ValueError(f"buffer.capacity=auto needs {why}")
        if self.train.batch_size == "auto":
            raise ValueError(f"train.batch_size=auto needs {why}")
        for key in ("staleness_horizon", "replay_ratio"):
            if getattr(self.buffer, key) is not None:
                raise ValueError(f"buffer.{key} needs {why}")

    def _check_method(self) -> None:
        """What the method's registry entry says it needs, then its own check."""
        name, spec = self.method.name, self.method_spec
        if spec.lockstep and not RUNTIMES.get(self.runtime).lockstep:
            raise ValueError(
                f"method.name={name} needs {runtimes_with('lockstep')} (got {self.runtime}): "
                "it decides each step's batch from that step's fresh groups"
            )
        if spec.single_learner and self.workers.learners > 1:
            # one state beside the learner (ReMix's window), kept by one learner
            raise ValueError(
                f"method.name={name} needs workers.learners=1 (got {self.workers.learners})"
            )
        a = self.algorithm
        if spec.advantage is not None and a.advantage != spec.advantage:
            raise ValueError(
                f"method.name={name} needs algorithm.advantage={spec.advantage} (got {a.advantage})"
            )
        if spec.loss is not None and a.loss_type != spec.loss:
            why = f"method.name={name} is built for algorithm.loss_type={spec.loss}"
            if spec.loss_strict:
                raise ValueError(f"{why} (got {a.loss_type})")
            warnings.warn(
                f"{why}: {a.loss_type} trains its batches without the method's own objective",
                stacklevel=2,
            )
        if spec.check is not None:
            spec.check(self)  # the method's own rules, next to its code

    def _check_sharding(self) -> None:
        """train.sharding=fsdp: what the sharded learners (run/distributed/fsdp.py) run."""
        t, why = self.train, None
        if not RUNTIMES.get(self.runtime).multi_learner or self.workers.learners < 2:
            why = (
                f"it shards over learner ranks: use {runtimes_with('multi_learner')} with "
                f"workers.learners >= 2 (got runtime={self.runtime}, workers.learners="
                f"{self.workers.learners})"
            )
        elif self.kl.beta > 0 and self.kl.target != "reference":
            why = (
                "kl.target=convex keeps pi_{k-1}, a frozen copy of the policy refreshed every "
                "step, which the sharded learners do not keep; use kl.target=reference (the "
                "initial policy, sharded like the policy) or train.sharding=none"
            )
        elif self.workers.learners % t.sharding_replicas:
            why = (
                f"train.sharding_replicas={t.sharding_replicas} must divide workers.learners="
                f"{self.workers.learners}"
            )
        if why is not None:
            raise ValueError(f"train.sharding=fsdp: {why}")

    def _check_loss_requirements(self) -> None:
        """A loss that is only meant for one setting (its registry entry's `requires`)."""
        from replayrl.algorithms import POLICY_LOSSES  # lazy: torch

        spec = POLICY_LOSSES.get(self.algorithm.loss_type)
        for key, wanted in spec.requires.items():
            value = config_value(self, key)
            if value != wanted:
                raise ValueError(
                    f"algorithm.loss_type={self.algorithm.loss_type} needs {key}={wanted} "
                    f"(got {value}): {spec.why}"
                )

    @property
    def generated_budget(self) -> int:
        """The run's generated-rollout budget: train.rollout_budget, else train.steps x R."""
        return self.train.rollout_budget or self.train.steps * self.rollouts_per_step

    def _check_signal(self) -> None:
        """Settings that would train nothing, or less than the log says, are refused."""
        from replayrl.algorithms import ADVANTAGES  # lazy: torch

        grouped = ADVANTAGES.get(self.algorithm.advantage).at_generation  # over a prompt's group
        if grouped and self.rollout.num_generations < 2:
            raise ValueError(
                f"rollout.num_generations=1 with algorithm.advantage={self.algorithm.advantage}: "
                "a group of one "
                "completion has advantage 0, so nothing would be learned; use >= 2 "
                "completions per prompt (or algorithm.advantage=gae with a critic)"
            )
        cap, b = self.buffer.capacity, self.train.batch_size
        if isinstance(cap, int) and b != "auto" and not self.buffer.with_replacement:
            if self.batch_size > cap:
                raise ValueError(
                    f"train.batch_size B={self.batch_size} is larger than buffer.capacity="
                    f"{cap}: batches would be capped at {cap} rollouts; raise the capacity, "
                    "lower the batch size, or set buffer.with_replacement=true"
                )

    def _check_async(self) -> None:
        rt, w = self.runtime, self.workers
        if self.needs_design:
            raise ValueError(
                f"buffer.capacity/train.batch_size=auto needs {runtimes_with('lockstep')} "
                f"(got runtime={rt}): "
                "run `replayrl design` with a measured mu and set them"
            )
        if w.max_staleness is not None and w.max_staleness < w.sync_every:
            raise ValueError(
                f"workers.max_staleness={w.max_staleness} is below workers.sync_every="
                f"{w.sync_every}: generators only see weights every {w.sync_every} steps"
            )
        if w.learners > 1:
            if not RUNTIMES.get(rt).multi_learner:
                raise ValueError(f"workers.learners > 1 needs {runtimes_with('multi_learner')}")
            if self.batch_size % w.learners:
                raise ValueError(
                    f"train.batch_size B={self.batch_size} must be divisible by "
                    f"workers.learners={w.learners} (each learner trains on B / T)"
                )
            cap = self.buffer.capacity
            if isinstance(cap, int) and cap % w.learners:
                raise ValueError(
                    f"buffer.capacity={cap} must be divisible by workers.learners="
                    f"{w.learners} (each learner keeps a shard of N / T)"
                )
            if self.buffer.num_shards not in (1, w.learners):
                raise ValueError(
                    f"buffer.num_shards={self.buffer.num_shards}: with {w.learners} learners "
                    "each learner samples its own shard (leave num_shards at 1)"
                )


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if not key or msg.startswith(key + "."):
            # a rule over the whole config, or a registered section's: it names its keys
            lines.append(f"  {msg}")
            continue
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key}: {e['msg']}{shown}")
    return "invalid config:\n" + "\n".join(lines)


def build_config(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Resolve a config: defaults <- experiment <- YAML file (a path, a preset name, or
    names joined by `+`: `replay+demo`) <- dotted overrides (config/layering.py)."""
    data, _ = resolve(path or None, list(overrides or []))
    return build_config(data)


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
