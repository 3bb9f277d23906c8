"""TRL `GRPOConfig` arguments understood by `ReplayConfig`: mapped, accepted, or refused.

Every argument of TRL 1.16's GRPOConfig (and the transformers TrainingArguments under it) falls
in one of four groups:

- **mapped** (`DIRECT`, and the ones `translate` handles together: batch terms, schedules,
  strategies, `loss_type`, `bf16`, ...): set the replayrl key with the same meaning;
- **no effect here** (`NO_EFFECT`): accepted whatever the value (logging cadence, data loader
  workers: replayrl logs every step);
- **refused** (`REFUSED`): a value other than TRL's default is an error that says what to use
  instead, or why it is not supported;
- anything else is an unknown name, answered with the nearest known names.

`TRL_DEFAULTS` are TRL's defaults for the mapped arguments (tests compare them with a real
`trl.GRPOConfig`): a `ReplayConfig` without a preset that uses TRL's argument names, or a
`GRPOConfig` object, starts from them, so the same script trains with the same
hyper-parameters. A preset keeps its own values, and the differences that matter are listed
once at start (`notes`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayrl.algorithms.correction import IS_MODES
from replayrl.config.schema import ConfigError

# TRL name -> replayrl key, same meaning and units
DIRECT: dict[str, str] = {
    "learning_rate": "train.lr",
    "weight_decay": "train.weight_decay",
    "max_grad_norm": "train.max_grad_norm",
    "seed": "train.seed",
    "warmup_ratio": "train.warmup_ratio",
    "num_generations": "rollout.num_generations",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",  # (TRL's None: off, the default here too)
    "repetition_penalty": "rollout.repetition_penalty",
    "beta": "kl.beta",
    "epsilon": "algorithm.epsilon",
    "epsilon_high": "algorithm.epsilon_high",
    "entropy_coef": "algorithm.entropy_coef",
    "importance_sampling_level": "algorithm.importance_sampling_level",  # sequence: GSPO
    "mask_truncated_completions": "algorithm.mask_truncated_completions",
    "save_total_limit": "checkpoint.keep_last",
    "activation_checkpointing": "model.gradient_checkpointing",  # transformers 5's new name
    "gradient_checkpointing": "model.gradient_checkpointing",  # (wins when both are given)
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "vllm_max_model_length": "vllm.max_model_len",
    # the address of the server that rollout.backend=vllm_server generates with
    "vllm_server_host": "vllm.server.host",
    "vllm_server_port": "vllm.server.port",
    "vllm_server_base_url": "vllm.server.base_url",
    "vllm_server_timeout": "vllm.server.connect_timeout_s",
}
# TRL 1.16's vllm_importance_sampling_cap default (its mode default: sequence_mask)
TRL_IS_CAP = 3.0
NULLABLE = ("epsilon_high", "max_grad_norm")  # None has the same meaning here
# mapped by `translate`, several at a time or with a value conversion
SPECIAL = (
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
    "loss_type",
    "scale_rewards",
    "lr_scheduler_type",
    "warmup_steps",
    "bf16",
    "save_strategy",
    "save_steps",
    "eval_strategy",
    "eval_steps",
    "report_to",
    "disable_tqdm",
    "reward_weights",
    "use_vllm",
    "use_cpu",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_cap",
)
TRL_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-6,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "seed": 42,
    "num_generations": 8,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 512,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "beta": 0.0,
    "epsilon": 0.2,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "num_iterations": 1,
    "entropy_coef": 0.0,
    "gradient_checkpointing": True,
    "bf16": True,
    "max_steps": -1,
    "num_train_epochs": 3.0,
    "save_strategy": "steps",
    "save_steps": 500,
    "eval_strategy": "no",
    "report_to": "none",
    "output_dir": "trainer_output",
}
# accepted with any value: nothing to do here (replayrl logs every step to metrics.jsonl,
# trains on the model's device, reads datasets itself)
NO_EFFECT = frozenset(
    """logging_steps logging_strategy logging_first_step logging_dir log_level
    log_level_replica log_on_each_node logging_nan_inf_filter run_name project trackio_space_id
    trackio_bucket_id trackio_static_space_id dataloader_num_workers dataloader_pin_memory
    dataloader_drop_last dataloader_persistent_workers dataloader_prefetch_factor
    dataloader_multiprocessing_context dataloader_in_order remove_unused_columns shuffle_dataset
    do_train do_eval do_predict local_rank ddp_find_unused_parameters ddp_bucket_cap_mb
    ddp_broadcast_buffers ddp_static_graph ddp_backend ddp_timeout
    log_unique_prompts log_multimodal save_only_model
    save_on_each_node per_device_eval_batch_size trust_remote_code pad_to_multiple_of
    ds3_gather_for_generation skip_memory_metrics include_num_input_tokens_seen
    average_tokens_across_devices gradient_checkpointing_kwargs sapo_temperature_neg
    sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg
    ref_model_mixup_alpha ref_model_sync_steps use_bias_correction_kl use_cache
    overwrite_output_dir eval_accumulation_steps eval_do_concat_batches eval_use_gather_object
    prediction_loss_only label_names length_column_name train_sampling_strategy
    restore_callback_states_from_checkpoint log_completions_hub_repo hub_token
    hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision debug
    accelerator_config entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target
    optim_target_modules include_for_metrics batch_eval_metrics
    activation_checkpointing_kwargs eval_delay""".split()
)
# refused unless at TRL's default (the first item): the message says what to use instead
REFUSED: dict[str, tuple[Any, str]] = {
    "delta": (None, "not supported: two-sided clipping is not implemented (algorithm__epsilon)"),
    "top_entropy_quantile": (1.0, "not supported: every token is trained on"),
    "generation_kwargs": (
        None,
        "not supported: use temperature, top_p, top_k, min_p, repetition_penalty, "
        "max_completion_length",
    ),
    "chat_template_kwargs": (None, "use task__system_prompt / task__chat_template instead"),
    "cache_implementation": (None, "not supported: the generator manages its own KV cache"),
    "fp16": (False, "use bf16=True instead: fp16 learning needs a gradient scaler"),
    "tf32": (None, "not supported: CPU fp32 matmuls are precision__fast_fp32_matmul"),
    "optim": (
        "adamw_torch_fused",
        "not supported: the optimizer is torch AdamW (optim='adamw_torch' is the same)",
    ),
    "adam_beta1": (0.9, "not supported: AdamW uses torch's betas (0.9, 0.999)"),
    "adam_beta2": (0.999, "not supported: AdamW uses torch's betas (0.9, 0.999)"),
    "adam_epsilon": (1e-8, "not supported: AdamW uses torch's eps 1e-8"),
    "optim_args": (None, "not supported: the optimizer is torch AdamW"),
    "lr_scheduler_kwargs": (None, "not supported: schedules are constant, linear or cosine"),
    "label_smoothing_factor": (0.0, "not supported: an RL loss has no labels"),
    "neftune_noise_alpha": (None, "not supported: no embedding noise"),
    "torch_compile": (False, "not supported: the model runs eagerly"),
    "torch_compile_backend": (None, "not supported: the model runs eagerly"),
    "torch_compile_mode": (None, "not supported: the model runs eagerly"),
    "use_liger_kernel": (False, "not supported: log-probs use train__logprobs_impl"),
    "liger_kernel_config": (None, "not supported: log-probs use train__logprobs_impl"),
    "auto_find_batch_size": (False, "not supported (TRL refuses it for GRPO too)"),
    "multi_objective_aggregation": (
        "sum_then_normalize",
        "not supported: rewards are summed with reward_weights, then normalised per group",
    ),
    "sync_ref_model": (
        False,
        "not supported; ReMix's KL to the previous policy is kl__target='convex' (ReMix preset)",
    ),
    "use_adaptive_entropy": (False, "not supported: algorithm__entropy_coef is fixed"),
    "off_policy_mask_threshold": (None, "not supported: use buffer__max_staleness instead"),
    "num_generations_eval": (None, "not supported: evaluation is greedy (one completion)"),
    "max_tool_calling_iterations": (None, "not supported: no tool calling"),
    "disable_dropout": (False, "not supported: dropout is as the model's config sets it"),
    "cast_lm_head_to_fp32": (False, "not supported: use precision__learner_autocast='none'"),
    "router_aux_loss_coef": (None, "not supported: no mixture-of-experts auxiliary loss"),
    "model_init_kwargs": (None, "pass a model object, or use model__dtype for the dtype"),
    "use_transformers_paged": (False, "not supported: use rollout__generation_impl"),
    "use_transformers_continuous_batching": (False, "not supported: use rollout__generation_impl"),
    "transformers_continuous_batching_config": (None, "not supported"),
    "vllm_structured_outputs_regex": (None, "not supported: no constrained decoding"),
    "vllm_mode": (
        "colocate",
        "server mode is rollout__backend='vllm_server' (start the server with `replayrl "
        "serve-vllm`; vllm__server__* says where it is), colocate is rollout__backend='vllm'",
    ),
    "vllm_model_impl": ("vllm", "not supported: the engine uses vLLM's own model code"),
    "vllm_group_port": (
        51216,
        "not supported: weights reach a vLLM server as files in vllm__server__weights_dir, not "
        "over an NCCL group",
    ),
    "vllm_enable_sleep_mode": (False, "not supported: the engine stays loaded between steps"),
    "vllm_importance_sampling_clip_min": (
        None,
        "not supported: the correction truncates from above only (vllm__truncated_is_cap)",
    ),
    "max_prompt_length": (
        None,
        "not supported (nor in TRL 1.16's GRPOConfig): prompts too long for the model are "
        "skipped and counted (prompts_skipped_too_long), never truncated",
    ),
    "push_to_hub": (False, "not supported: save_model() then upload with huggingface_hub"),
    "resume_from_checkpoint": (None, "pass it to train(resume_from_checkpoint=...) instead"),
    "load_best_model_at_end": (False, "not supported: summary.json has best_eval_accuracy"),
    "metric_for_best_model": (None, "not supported: the metric is eval/accuracy"),
    "greater_is_better": (None, "not supported: the metric is eval/accuracy"),
    "eval_on_start": (False, "replayrl evaluates the start policy whenever it evaluates"),
    "bf16_full_eval": (False, "not supported: evaluation runs in the generator's precision"),
    "fp16_full_eval": (False, "not supported: evaluation runs in the generator's precision"),
    "full_determinism": (False, "not supported: runs are seeded (seed) and repeatable on CPU"),
    "data_seed": (None, "not supported: seed (train.seed) and task__seed seed the data"),
    "ignore_data_skip": (False, "not supported: resume continues the sampler's RNG"),
    "torch_empty_cache_steps": (None, "not supported"),
    "jit_mode_eval": (False, "not supported"),
    "enable_jit_checkpoint": (False, "not supported: Ctrl-C writes a checkpoint"),
    "fsdp": (None, "not mapped: sharded learners are runtime='ray' with train.sharding='fsdp'"),
    "fsdp_config": (
        None,
        "not mapped: sharded learners are runtime='ray' with train.sharding='fsdp'",
    ),
    "deepspeed": (None, "not supported: data parallel learners are runtime='ray'"),
    "parallelism_config": (None, "not supported: data parallel learners are runtime='ray'"),
}
# TRL loss_type -> replayrl algorithm.loss_agg (the same normalisation on one process)
LOSS_TYPES = {"grpo": "seq_mean", "dapo": "token_mean", "bnpo": "token_mean", "dr_grpo": "dr_grpo"}
LR_SCHEDULES = {
    "linear": "linear",
    "cosine": "cosine",
    "constant": "constant",
    "constant_with_warmup": "constant",
}
# the completions log (logging.completions): on here by default; TRL's switch and count set it
COMPLETIONS = ("log_completions", "num_completions_to_print")
KNOWN = frozenset([*DIRECT, *SPECIAL, *NO_EFFECT, *REFUSED, *COMPLETIONS])


def plain(value: Any) -> Any:
    """An enum's value (TRL's resolved fields are enums: IntervalStrategy.NO -> 'no')."""
    return value.value if isinstance(value, enum.Enum) else value


def suggest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean a, b?)' for the nearest candidates, else ''."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def read_grpo_config(args: Any) -> dict[str, Any]:
    """The arguments of a TRL `GRPOConfig` object: every mapped field's resolved value, and the
    refused ones only where they differ from their default (which raises in `translate`)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(args):
        if not f.init or (f.name in NO_EFFECT and f.name != "logging_steps"):
            continue  # (logging_steps: TRL's eval interval when eval_steps is unset)
        value = plain(getattr(args, f.name))
        if f.name in DIRECT or f.name in SPECIAL:
            out[f.name] = value
            continue
        if f.default is not dataclasses.MISSING:
            default = plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if value != default and (value or default):  # None vs {} or [] is no setting
            out[f.name] = value
    # TRL derives these two from the batch terms: keep one of them, as given
    if out.get("steps_per_generation") == out.get("gradient_accumulation_steps"):
        out.pop("steps_per_generation", None)
    if out.get("generation_batch_size") == out.get("per_device_train_batch_size", 0) * out.get(
        "steps_per_generation", out.get("gradient_accumulation_steps", 1)
    ):
        out.pop("generation_batch_size", None)
    return out


def is_grpo_config(obj: Any) -> bool:
    """A transformers TrainingArguments (TRL's GRPOConfig is one), without importing trl."""
    mro: tuple[type, ...] = type(obj).__mro__
    return dataclasses.is_dataclass(obj) and any(c.__name__ == "TrainingArguments" for c in mro)


def check_override_keys(keys: Iterable[str], replayrl_keys: Iterable[str]) -> None:
    """Dotted override keys that name no config key -> ConfigError with the nearest keys."""
    dotted = list(replayrl_keys)
    bad = [
        k
        for k in keys
        if all(k.split("."))
        and "=" not in k  # malformed ones: the parser's own error
        and not any(k == d or k.startswith(d + ".") or d.startswith(k + ".") for d in dotted)
    ]
    if bad:
        hints = "; ".join(f"{k}{suggest(k, dotted)}" for k in bad)
        raise ConfigError(
            f"unknown config key(s) {hints} (`replayrl config show --doc` lists them)"
        )


def check_names(names: Iterable[str], replayrl_keys: Iterable[str]) -> None:
    """Unknown names -> ConfigError with the nearest TRL names and replayrl keys."""
    dotted = list(replayrl_keys)
    keys = [k.replace(".", "__") for k in dotted]

    def known_key(name: str) -> bool:
        key = name.replace("__", ".")  # a dict-valued key (task.reasoning_gym.config.x) too
        return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in dotted)

    unknown = [n for n in names if n not in KNOWN and ("__" not in n or not known_key(n))]
    if unknown:
        hints = "; ".join(f"{n}{suggest(n, [*KNOWN, *keys])}" for n in unknown)
        raise ConfigError(
            f"ReplayConfig: unknown argument(s) {hints}. TRL's GRPOConfig names are read "
            "(docs/python-api.md, 'From TRL'), replayrl keys as section__key (method__name), "
            "or overrides=[...]"
        )


@dataclass(frozen=True)
class Updates:
    """Optimizer updates per step of a resolved run, as TRL counts its steps: `first` for the
    first steps (a replay buffer still filling holds fewer than B rollouts), then `steady`."""

    steady: int
    first: tuple[int, ...] = ()

    def total(self, steps: int) -> int:
        """Updates taken by the end of step `steps`."""
        head = self.first[:steps]
        return sum(head) + max(0, steps - len(head)) * self.steady

    def steps_for(self, updates: int) -> int:
        """The fewest steps that take at least `updates` updates."""
        done = 0
        for i, k in enumerate(self.first, 1):
            done += k
            if done >= updates:
                return i
        return len(self.first) + max(0, math.ceil((updates - done) / self.steady))


@dataclass
class Translation:
    """What TRL arguments become: dotted overrides, the notes to print once at start, and the
    numbers the trainer needs (steps from epochs, TRL's view of the batch terms)."""

    dotted: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reward_weights: list[float] | None = None
    epochs_to_steps: float | None = None  # max_steps=-1: num_train_epochs over the dataset
    updates_per_step: int = 1  # TRL optimizer steps per replayrl step
    completions_per_update: int = 0  # per_device_train_batch_size * gradient_accumulation
    view: dict[str, Any] = field(default_factory=dict)  # TRL names, resolved
    vllm_notes: list[str] = field(default_factory=list)  # said only when vLLM generates
    counts: Updates | None = None  # the resolved run's updates per step (ReplayConfig sets it)


def _refuse(values: Mapping[str, Any]) -> None:
    bad = [
        f"{n}={v!r}: {REFUSED[n][1]}"
        for n, v in values.items()
        if n in REFUSED and plain(v) != REFUSED[n][0]
    ]
    if values.get("use_vllm"):
        bad.append("use_vllm=True: use rollout__backend='vllm' instead")
    if bad:
        raise ConfigError("ReplayConfig: " + "; ".join(bad))


def _batch_terms(
    v: Mapping[str, Any], group: int, t: Translation, batch_of: Callable[[int], int] | None = None
) -> None:
    """TRL's batch terms -> prompts per step, mini-batch and updates per step.

    TRL generates generation_batch_size = per_device_train_batch_size * steps_per_generation
    completions at a time (steps_per_generation defaults to gradient_accumulation_steps), and
    takes one optimizer step per per_device * accumulation completions, num_iterations times
    over each generation. Here one step generates them all and trains on them: R =
    generation_batch_size, mini-batch = per_device * accumulation, epochs = num_iterations.
    A replay preset keeps its own batch B (or its replay ratio y = B / R): `batch_of(R)` gives
    B, and a step then takes ceil(B / mini-batch) updates, which TRL's step counts divide by.
    """
    given = [k for k in ("per_device_train_batch_size", "generation_batch_size") if k in v]
    if not given and "steps_per_generation" not in v and "gradient_accumulation_steps" not in v:
        return
    pd = int(v.get("per_device_train_batch_size", 0) or 0)
    ga = int(v.get("gradient_accumulation_steps", 1) or 1)
    spg, gbs = v.get("steps_per_generation"), v.get("generation_batch_size")
    if spg is not None and gbs is not None:
        raise ConfigError("generation_batch_size and steps_per_generation: give one (as TRL)")
    if not pd:  # replayrl's own meaning of generation_batch_size alone: completions per step
        pd = int(gbs or 0)
        if not pd:
            raise ConfigError("steps_per_generation needs per_device_train_batch_size")
    if gbs is None:
        gbs = pd * (int(spg) if spg is not None else ga)
    per_update = pd * ga
    if not isinstance(gbs, int) or gbs < group or gbs % group:
        raise ConfigError(
            f"generation_batch_size={gbs!r} must be a positive multiple of num_generations={group}"
        )
    if gbs % per_update:
        raise ConfigError(
            f"generation_batch_size={gbs} must be a multiple of per_device_train_batch_size * "
            f"gradient_accumulation_steps = {per_update} (each update takes {per_update})"
        )
    t.dotted["rollout.prompts_per_step"] = gbs // group
    trained = batch_of(gbs) if batch_of is not None else gbs  # B: what one step trains on
    updates = math.ceil(trained / per_update)
    t.dotted["train.mini_batch_size"] = per_update if updates > 1 else None
    t.updates_per_step *= updates
    t.completions_per_update = per_update
    t.view.update(
        per_device_train_batch_size=pd,
        gradient_accumulation_steps=ga,
        generation_batch_size=gbs,
        steps_per_generation=gbs // pd,
    )


def _schedule(v: Mapping[str, Any], t: Translation) -> None:
    if "lr_scheduler_type" in v:
        kind = plain(v["lr_scheduler_type"])
        if kind not in LR_SCHEDULES:
            raise ConfigError(
                f"lr_scheduler_type={kind!r}: not supported (known: {', '.join(LR_SCHEDULES)})"
            )
        t.dotted["train.lr_scheduler"] = LR_SCHEDULES[kind]
    if "warmup_steps" in v:
        w = v["warmup_steps"]
        if isinstance(w, float) and 0 < w < 1:  # transformers 5: a float below 1 is a ratio
            t.dotted["train.warmup_ratio"] = w
        else:
            t.dotted["train.warmup_steps"] = int(w)


def _strategies(v: Mapping[str, Any], t: Translation) -> None:
    save = plain(v.get("save_strategy", "steps"))
    if save not in ("steps", "no", "best"):
        raise ConfigError(f"save_strategy={save!r}: not supported (use 'steps' with save_steps)")
    if save == "no":
        t.dotted["checkpoint.every"] = 0
        t.notes.append(
            "save_strategy='no': a final checkpoint is still written (train(resume_"
            "from_checkpoint=True) needs it)"
        )
    elif "save_steps" in v:
        steps = v["save_steps"]
        if isinstance(steps, float) and steps < 1:
            raise ConfigError(f"save_steps={steps}: give a number of steps, not a ratio")
        t.dotted["checkpoint.every"] = max(1, math.ceil(int(steps) / t.updates_per_step))
    if "eval_strategy" in v:
        ev = plain(v["eval_strategy"])
        if ev not in ("no", "steps"):
            raise ConfigError(f"eval_strategy={ev!r}: not supported (use 'steps' or 'no')")
        t.view["eval_strategy"] = ev
        if ev == "steps":
            every = v.get("eval_steps") or v.get("logging_steps") or 500
            t.dotted["eval.every"] = max(1, math.ceil(int(every) / t.updates_per_step))
    elif v.get("eval_steps"):
        t.dotted["eval.every"] = max(1, math.ceil(int(v["eval_steps"]) / t.updates_per_step))


def _steps(v: Mapping[str, Any], t: Translation) -> None:
    if "max_steps" not in v:
        return
    steps = int(v["max_steps"])
    if steps < 0:
        t.epochs_to_steps = float(v.get("num_train_epochs", TRL_DEFAULTS["num_train_epochs"]))
        return
    counts = t.counts or Updates(t.updates_per_step)
    t.dotted["train.steps"] = counts.steps_for(steps)
    if counts.steady > 1 or counts.first:
        filling = " (fewer while the replay buffer fills)" if counts.first else ""
        t.notes.append(
            f"max_steps={steps} counts optimizer updates in TRL; here a step generates once and "
            f"takes {counts.steady} updates{filling}, so {t.dotted['train.steps']} steps "
            f"({counts.total(t.dotted['train.steps'])} updates; the learning rate changes per "
            "step)"
        )


def _simple(name: str, value: Any, t: Translation) -> None:
    if name == "output_dir":
        path = Path(value if value is not None else "trainer_output").expanduser()
        if not path.name or path.name in (".", ".."):
            raise ConfigError(f"output_dir={value!r} must end in a folder name")
        t.dotted.update({"logging.run_dir": str(path.parent), "logging.name": path.name})
    elif name == "scale_rewards":
        mapping = {True: True, False: False, "group": True, "none": False}
        if isinstance(value, int) and not isinstance(value, bool) or value not in mapping:
            raise ConfigError(
                f"scale_rewards={value!r}: replayrl normalises per group ('group' / True) or "
                "not at all ('none' / False)"
            )
        t.dotted["algorithm.scale_rewards"] = mapping[value]
    elif name == "report_to":
        sinks = [value] if isinstance(value, str) else list(value or [])
        bad = [s for s in sinks if s not in ("wandb", "tensorboard", "none", "all")]
        if bad:
            raise ConfigError(
                f"report_to: unknown {bad} (replayrl logs to: wandb, tensorboard, none; "
                "metrics.jsonl is always written)"
            )
        every = "all" in sinks
        t.dotted["logging.wandb"] = every or "wandb" in sinks
        t.dotted["logging.tensorboard"] = every or "tensorboard" in sinks
    elif name == "disable_tqdm":
        t.dotted["logging.progress"] = not value
    elif name == "reward_weights":
        t.reward_weights = [float(w) for w in value] if value is not None else None
    elif name == "loss_type":
        if value not in LOSS_TYPES:
            raise ConfigError(
                f"loss_type={value!r}: TRL's {', '.join(LOSS_TYPES)} map to algorithm.loss_agg; "
                "others are not implemented (replayrl's losses: algorithm__loss_type=grpo_clip, "
                "asymre, mix_ppg)"
            )
        t.dotted["algorithm.loss_agg"] = LOSS_TYPES[value]
    elif name == "bf16":
        t.dotted["precision.learner_autocast"] = "bfloat16" if value else "none"
    elif name == "use_cpu":
        if value:  # else: the model's own device (or train.device)
            t.dotted["train.device"] = "cpu"


def _vllm_correction(values: Mapping[str, Any], t: Translation) -> None:
    """TRL's vLLM importance-sampling correction -> precision.importance_sampling_mode and
    vllm.truncated_is_cap (algorithms/correction.py). Given a mode (a ported GRPOConfig always
    has one: TRL 1.16's default is sequence_mask at cap 3.0), TRL's choice applies, said in a
    note where it differs from replayrl's own default (token_truncate at 2.0)."""
    cap = values.get(
        "vllm_importance_sampling_clip_max", values.get("vllm_importance_sampling_cap")
    )
    mode = values.get("vllm_importance_sampling_mode")
    if mode is not None:
        if mode not in IS_MODES:
            raise ConfigError(
                f"vllm_importance_sampling_mode={mode!r}: one of {', '.join(IS_MODES)}"
            )
        cap = TRL_IS_CAP if cap is None else cap
        t.dotted["precision.importance_sampling_mode"] = mode
    if cap is not None:
        t.dotted["vllm.truncated_is_cap"] = float(cap)
    if values.get("vllm_importance_sampling_correction") is False:
        t.dotted["vllm.truncated_is_cap"] = None
    elif mode is not None and (mode, float(cap)) != ("token_truncate", 2.0):
        t.vllm_notes.append(
            f"vllm_importance_sampling_mode={mode!r}, cap {float(cap):g}: TRL's correction of "
            "the vLLM/trainer mismatch applies with rollout__backend='vllm' (replayrl's own "
            "default: token_truncate at 2.0)"
        )


def translate(
    values: Mapping[str, Any],
    base: Mapping[str, Any],
    passes_key: str = "train.epochs",
    updates: Updates | None = None,
) -> Translation:
    """TRL-named `values` -> replayrl overrides. `base`: the config data they apply to (for
    num_generations when not given); `passes_key`: the method's key of passes per batch
    (num_iterations sets it: `method.remix.utd` for ReMix); `updates`: optimizer updates per
    step as the resolved config takes them (the preset's batch, mini-batch and passes
    included), which TRL's step counts are divided by."""
    _refuse(values)
    t = Translation()
    group = int(values.get("num_generations") or base.get("num_generations") or 8)
    _batch_terms({**values, "num_generations": group}, group, t, base.get("batch_of"))
    if "num_iterations" in values:
        n = int(values["num_iterations"])
        if n < 1:
            raise ConfigError(f"num_iterations={n} must be >= 1")
        # a method may count passes per batch its own way (ReMix's update-to-data ratio m,
        # arXiv 2507.06892, which does not multiply TRL's update count)
        own = passes_key != "train.epochs"
        t.dotted[passes_key] = n
        t.updates_per_step *= 1 if own else n
        t.view["num_iterations"] = n
    if updates is not None:
        t.updates_per_step, t.counts = updates.steady, updates
    for name in ("output_dir", "scale_rewards", "report_to", "disable_tqdm", "reward_weights"):
        if name in values:
            _simple(name, values[name], t)
    for name in ("loss_type", "bf16", "use_cpu"):
        if name in values:
            _simple(name, values[name], t)
    _vllm_correction(values, t)
    for name, key in DIRECT.items():
        # None: TRL's "unset" (save_total_limit: keep all); kept only where replayrl has it
        if name in values and (values[name] is not None or name in NULLABLE):
            t.dotted[key] = values[name]
    _schedule(values, t)
    _strategies(values, t)
    _steps(values, t)
    _completions(values, t)
    return t


def _completions(v: Mapping[str, Any], t: Translation) -> None:
    """log_completions=False: no completions log; num_completions_to_print: per logged step."""
    if v.get("log_completions") is False:
        t.dotted["logging.completions"] = 0
        return
    n = v.get("num_completions_to_print")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"num_completions_to_print={n!r} must be an integer >= 0")
        t.dotted["logging.completions"] = n
