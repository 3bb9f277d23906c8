"""`ReplayConfig`: a run's configuration for the Python API, the counterpart of TRL's
`GRPOConfig` (a preset, TRL-named keyword arguments, replayrl keys, dotted overrides)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from replayrl.api import trl_args
from replayrl.api.trl_args import Translation, Updates
from replayrl.config.layering import layered
from replayrl.config.method_sections import legacy_keys, method_of
from replayrl.config.overrides import set_dotted
from replayrl.config.registries import METHODS
from replayrl.config.schema import (
    Config,
    ConfigError,
    apply_overrides,
    build_config,
    config_value,
    section_fields,
)

# paper 1's replay ratio y = B / R and staleness horizon x = N / R -> B and N for R rollouts a step
# paper 1's ratios by name: they set the config's ratio keys, and the absolute size they
# replace is cleared so it is derived from the ratio (N = round(x R), B = round(y R))
PAPER_TERMS = {"replay_ratio": "train.batch_size", "staleness_horizon": "buffer.capacity"}


def config_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config schema (`train.lr`, `buffer.capacity`, ...)."""
    keys = []
    for name, sub in section_fields(model).items():
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys += config_keys(sub, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def updates_per_step(cfg: Config) -> tuple[Updates | None, str]:
    """(the optimizer updates each step takes, "") where they follow from the config, else
    (None, why): TRL counts max_steps, save_steps and eval_steps in optimizer updates, and a
    step here generates once, then takes passes x ceil(batch / mini-batch) of them."""
    mini = cfg.train.mini_batch_size
    if cfg.needs_design:
        return None, "train.batch_size=auto: the run's design picks the batch at its start"
    spec = cfg.method_spec
    why = spec.passes_change(cfg) if spec.passes_change is not None else None
    if why is not None:
        return None, why
    passes = int(config_value(cfg, spec.passes_key))
    varying = spec.steady_batch is None or not spec.steady_batch(cfg)
    replay = spec.buffer == "replay"
    if mini is None:  # one update per pass, whatever the batch
        return Updates(passes), ""
    if varying or (replay and cfg.buffer.max_staleness is not None):
        what = f"method {cfg.method.name}" if varying else "buffer.max_staleness drops rollouts"
        return None, (
            f"the batch size changes from step to step ({what}) and each step takes "
            f"ceil(B / train.mini_batch_size={mini}) updates per pass"
        )
    b = cfg.batch_size
    first: list[int] = []
    if replay:  # the buffer holds k R rollouts (at most N) at step k
        r, cap = cfg.rollouts_per_step, cfg.buffer.capacity
        n = cap if isinstance(cap, int) else b
        b = min(b, n)
        while min((len(first) + 1) * r, n) < b:
            first.append(passes * math.ceil((len(first) + 1) * r / mini))
    return Updates(passes * math.ceil(b / mini), tuple(first)), ""


def trl_view(cfg: Config, translation: Translation) -> dict[str, Any]:
    """The resolved run under TRL's argument names (what `trainer.args.<name>` reads); the
    step counts are None where steps take different numbers of optimizer updates."""
    t, r, a = cfg.train, cfg.rollout, cfg.algorithm
    per_update = translation.completions_per_update or (t.mini_batch_size or cfg.batch_size)
    counts = updates_per_step(cfg)[0]
    # rows held out (none from a dataset without eval_size or eval_path) and evaluated
    held_out = cfg.task.eval_size > 0 or getattr(cfg.task.settings, "eval_path", None)
    evaluates = bool(cfg.eval.every and held_out)
    agg = {v: k for k, v in trl_args.LOSS_TYPES.items() if k != "bnpo"}
    view: dict[str, Any] = {
        "output_dir": str(Path(cfg.logging.run_dir) / cfg.logging.name),
        "max_steps": counts.total(t.steps) if counts is not None else None,
        "learning_rate": t.lr,
        "lr_scheduler_type": t.lr_scheduler,
        "warmup_steps": t.warmup_steps,
        "warmup_ratio": t.warmup_ratio,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "seed": t.seed,
        "num_generations": r.num_generations,
        "generation_batch_size": cfg.rollouts_per_step,
        "per_device_train_batch_size": per_update,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": max(1, cfg.rollouts_per_step // per_update),
        "num_iterations": config_value(cfg, cfg.method_spec.passes_key),
        "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "min_p": r.min_p or None,  # TRL's "off"
        "repetition_penalty": r.repetition_penalty,
        "importance_sampling_level": a.importance_sampling_level,
        "mask_truncated_completions": a.mask_truncated_completions,
        "beta": cfg.kl.beta,
        "epsilon": a.epsilon,
        "epsilon_high": a.epsilon_high,
        "loss_type": agg.get(a.loss_agg, a.loss_agg),
        "scale_rewards": "group" if a.scale_rewards else "none",
        "entropy_coef": a.entropy_coef,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "bf16": cfg.precision.learner_autocast == "bfloat16",
        "save_steps": cfg.checkpoint.every * counts.steady if counts is not None else None,
        "save_strategy": "steps" if cfg.checkpoint.every else "no",
        "save_total_limit": cfg.checkpoint.keep_last,
        "eval_strategy": "steps" if evaluates else "no",
        "eval_steps": cfg.eval.every * counts.steady if counts and evaluates else None,
        "report_to": [s for s in ("wandb", "tensorboard") if getattr(cfg.logging, s)] or "none",
        "run_name": cfg.logging.name,
        "logging_steps": 1,  # every step is logged
        "disable_tqdm": not cfg.logging.progress,
    }
    view.update(translation.view)
    return view


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """data['a']['b'] = value for key 'a.b' (sections created as needed)."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override {key!r} has an empty key")
    set_dotted(data, parts, value, key)


class ReplayConfig:
    """A run's configuration: a preset plus overrides (the counterpart of TRL's `GRPOConfig`).

    Args:
        preset: a shipped preset name (`replayrl presets`: "grpo", "replay", "remix-grpo",
            ...), a YAML file, a `Config` object, a TRL `GRPOConfig` object (its fields are
            read), or None.
        overrides: dotted overrides applied last, as a list of "key=value" strings (the CLI's
            syntax: `["buffer.capacity=512", "train.lr=1e-4"]`) or a mapping
            `{"buffer.capacity": 512}`.
        **kwargs: TRL `GRPOConfig` argument names, or replayrl keys with `__` for the dot
            (`method__name="replay"`, `method__remix__utd=2`).

    TRL's arguments (docs/python-api.md, "From TRL"): `output_dir` (the run folder),
    `max_steps` (-1: `num_train_epochs` over the dataset), `learning_rate`,
    `lr_scheduler_type` (linear, cosine, constant), `warmup_steps`, `warmup_ratio`,
    `weight_decay`, `max_grad_norm`, `seed`, `num_generations`,
    `per_device_train_batch_size`, `gradient_accumulation_steps`, `steps_per_generation`,
    `generation_batch_size` (completions generated per step), `num_iterations` (passes per
    generation; ReMix's update-to-data ratio m under a ReMix preset), `max_completion_length`,
    `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `beta`, `epsilon`,
    `epsilon_high`, `importance_sampling_level` ("sequence": GSPO), `loss_type` (grpo -> seq_mean,
    dapo / bnpo -> token_mean, dr_grpo), `scale_rewards`, `entropy_coef`, `bf16` (learner
    autocast), `gradient_checkpointing`, `save_strategy` / `save_steps` /
    `save_total_limit`, `eval_strategy` / `eval_steps`, `report_to`, `disable_tqdm`,
    `reward_weights`, `use_cpu` (train.device=cpu; otherwise a model object trains on its own
    device), `vllm_max_model_length`, `vllm_importance_sampling_correction` /
    `_clip_max` (vllm.truncated_is_cap). Logging arguments (`logging_steps`, ...) are
    accepted and have no effect (every step is logged). Others are refused with what to use
    instead; a misspelled name gets the nearest names.

    Without a preset, TRL's arguments start from TRL's defaults (lr 1e-6 decaying linearly,
    8 completions per step, bf16, gradient checkpointing, no evaluation, seed 42, ...), so a
    ported script trains like under TRL. A preset keeps its own values (constant learning
    rate, its batch); the trainer prints at start a table of every setting that differs from
    what was passed or from TRL's default. TRL's step counts (max_steps, save_steps,
    eval_steps) are optimizer updates: they become the steps of the resolved run that take
    them, and max_steps is refused where steps take different numbers (ReMix).

    The papers' knobs (set as section__key, or in `overrides`):

    - `method__name="replay"`: experience replay (arXiv 2604.08706): keep a FIFO buffer and
      train each step on rollouts sampled from it;
    - `buffer__capacity` N: rollouts kept; the staleness horizon is x = N / R (R rollouts
      generated per step), `"auto"` picks x* from the measured cost ratio;
    - `train__batch_size` B: rollouts trained per step; the replay ratio is y = B / R
      (`"auto"`: y* from the cost model, `replayrl design`);
    - `replay_ratio=y` and `staleness_horizon=x` set B = y * R and N = x * R by the papers'
      names (R = prompts per step x num_generations; rounded);
    - `buffer__sampler="positive_bias"` with `buffer__delta`: oversample rewarded rollouts;
    - `buffer__max_staleness`: drop rollouts older than this many policy versions;
    - `algorithm__loss_type="asymre"` (with `algorithm__asymre_delta_v`): AsymRE's loss;
    - `method__name="remix"` (ReMix, arXiv 2507.06892; preset "remix-grpo"): Mix-PPG over
      fresh rollouts and those of the last `method__remix__num_policies` policies, with
      `method__remix__off_policy_fraction` p, update-to-data ratio `method__remix__utd` m
      (= num_iterations), policy reincarnation at `method__remix__reincarnation_step` T;
    - `kl__target="convex"` with `kl__beta`: ReMix's KL-Convex constraint;
    - `algorithm__entropy_coef`: entropy bonus (ReMix's c).

    `replayrl config show --doc` prints every key with its description.

    Validation happens when the config is resolved (`to_config()`, or when a `ReplayTrainer`
    is built), with errors naming the key. `args.<TRL name>` reads the values the run uses
    (`args.learning_rate`, `.per_device_train_batch_size`, ...): before a trainer is built,
    a method preset as it runs with your own model; once built, the trainer's resolution.

    Example: `ReplayConfig("remix-grpo", output_dir="runs/mine", max_steps=200,
    learning_rate=1e-6, overrides=["method.remix.off_policy_fraction=0.5"])`.
    """

    def __init__(
        self,
        preset: str | PathLike[str] | Config | Any | None = None,
        overrides: Sequence[str] | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        trl_values: dict[str, Any] = {}
        if trl_args.is_grpo_config(preset):  # a TRL GRPOConfig object: its fields, TRL mode
            trl_values = trl_args.read_grpo_config(preset)
            preset = None
        if preset is not None and not isinstance(preset, (str, PathLike, Config)):
            raise TypeError(
                f"preset must be a preset name, a YAML path, a Config or a TRL GRPOConfig "
                f"(got {type(preset)})"
            )
        self.preset: str | PathLike[str] | Config | None = preset
        # set by ReplayTrainer for a model object: a real model without a model.path
        self.real_model = False
        if isinstance(overrides, str):
            raise TypeError("overrides must be a list of 'key=value' strings or a mapping")
        self.overrides = overrides if overrides is not None else []
        self.kwargs = dict(kwargs)
        # paper 1's terms by name (arXiv 2604.08706): y = B / R and x = N / R
        self.paper_terms = {k: kwargs.pop(k) for k in PAPER_TERMS if k in kwargs}
        keys = config_keys() + legacy_keys()  # older configs' method keys are still read
        trl_args.check_names(kwargs, keys)
        given = self.overrides.keys() if isinstance(self.overrides, Mapping) else self.overrides
        trl_args.check_override_keys([str(o).split("=", 1)[0].strip() for o in given], keys)
        self._sections = {k.replace("__", "."): v for k, v in kwargs.items() if "__" in k}
        trl_values.update({k: v for k, v in kwargs.items() if "__" not in k})
        self.trl_values = trl_values
        # TRL's defaults apply when TRL's arguments are used without a preset
        self.trl_mode = preset is None and bool(trl_values)
        self.translation = self._translate()
        self.reward_weights = self.translation.reward_weights
        self.resolved: Config | None = None  # set by ReplayTrainer: what the run uses
        self._view: tuple[Config | None, dict[str, Any]] = (None, {})

    def _translate(self, updates: Updates | None = None) -> Translation:
        values = self.trl_values
        base = self._base()
        if self.trl_mode:
            values = {**trl_args.TRL_DEFAULTS, **values}
        given = json.loads(json.dumps(base))  # the preset and section__key arguments
        for key, value in self._sections.items():
            _set_dotted(given, key, value)
        try:
            method = method_of(given)
        except ValueError as exc:  # old keys that name no method (buffer.kind=lifo)
            raise ConfigError(str(exc)) from None
        spec = METHODS.get(method) if method in METHODS else None
        group = dict(base.get("rollout") or {}).get("num_generations")
        group = self._sections.get("rollout.num_generations", group)
        replay = spec is not None and spec.buffer == "replay"
        return trl_args.translate(
            values,
            {"num_generations": group, "batch_of": self._replay_batch(base) if replay else None},
            spec.passes_key if spec is not None else "train.epochs",
            updates,
        )

    def _replay_batch(self, base: dict[str, Any]) -> Callable[[int], int] | None:
        """B as a function of R under a replay buffer (its own B or y R), so TRL's step
        counts (max_steps, save_steps, eval_steps count optimizer updates) use the batch the
        learner really trains on; None: B = R."""
        buffer, train = dict(base.get("buffer") or {}), dict(base.get("train") or {})
        y = self.paper_terms.get("replay_ratio")
        if y is None:
            fixed = self._sections.get("train.batch_size", train.get("batch_size"))
            if isinstance(fixed, int) and not isinstance(fixed, bool):
                return lambda R: fixed
            y = self._sections.get("buffer.replay_ratio", buffer.get("replay_ratio"))
        if isinstance(y, (int, float)) and not isinstance(y, bool) and y > 0:
            return lambda R: max(1, math.floor(y * R + 0.5))
        return None  # auto (decided by the run's design) or on-policy sized

    @property
    def _dotted(self) -> dict[str, Any]:
        """TRL arguments' keys, then section__key arguments (these win)."""
        return {**self.translation.dotted, **self._sections}

    @property
    def notes(self) -> list[str]:
        """Where this configuration knowingly differs from TRL's behaviour (said at start)."""
        return list(self.translation.notes)

    def _base(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The preset's data with the experiment its model calls for put under a method
        preset (config/layering.py): the demo's for the tiny model, TRL's defaults for a real
        one (`model.path` given by the preset, an argument, an override or the trainer)."""
        if isinstance(self.preset, Config):
            return self.preset.model_dump(mode="json")
        if self.preset is None:
            return {}
        path = (extra or {}).get("model.path", self._sections.get("model.path"))
        if path is None and self.real_model:
            path = "(a model object)"
        if path is None and isinstance(self.overrides, Mapping):
            path = self.overrides.get("model.path")
        strings = [] if isinstance(self.overrides, Mapping) else list(self.overrides)
        return layered(str(self.preset), path, strings)[0]

    def override_strings(self) -> list[str]:
        """Every override as a CLI-style "key=value" string (JSON values are valid YAML)."""
        out = [f"{k}={json.dumps(v)}" for k, v in self._dotted.items()]
        if isinstance(self.overrides, Mapping):
            out += [f"{k}={json.dumps(v)}" for k, v in self.overrides.items()]
        else:
            out += list(self.overrides)
        for name, value in self.paper_terms.items():  # x or y, with the size it derives cleared
            out += [f"buffer.{name}={json.dumps(value)}", f"{PAPER_TERMS[name]}=null"]
        return out

    def data(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The config as a nested dict: preset <- keyword arguments <- overrides <- `extra`."""
        data = self._base(extra)
        for key, value in self._dotted.items():
            _set_dotted(data, key, value)
        if isinstance(self.overrides, Mapping):
            for key, value in self.overrides.items():
                _set_dotted(data, str(key), value)
        else:
            apply_overrides(data, list(self.overrides))
        for key, value in (extra or {}).items():
            _set_dotted(data, key, value)
        return data

    def to_config(self, extra: Mapping[str, Any] | None = None) -> Config:
        """The validated `Config` (ConfigError naming the key and value when invalid). TRL's
        step counts (max_steps, save_steps, eval_steps) are optimizer updates: they are
        divided by the updates a step of the resolved run takes (the preset's batch,
        mini-batch and passes included), and max_steps is refused where steps differ."""
        cfg = self._build(extra)
        updates, why = updates_per_step(cfg)
        counted = self._step_counts()
        if updates is None:
            if "max_steps" in counted:
                raise ConfigError(
                    f"max_steps={counted['max_steps']} counts optimizer updates in TRL, and "
                    f"here steps take different numbers of them ({why}): give the number of "
                    "steps (each generates once, then trains) as train__steps=N instead"
                )
            return cfg
        if not counted or updates == self.translation.counts:
            return cfg
        self.translation = self._translate(updates)
        self.reward_weights = self.translation.reward_weights
        return self._build(extra)

    def _step_counts(self) -> dict[str, Any]:
        """TRL's step counts given with another value than TRL's default (a GRPOConfig
        object carries them all)."""
        values = self.trl_values
        out = {
            k: values[k]
            for k in ("max_steps", "save_steps", "eval_steps")
            if values.get(k) is not None and values[k] != trl_args.TRL_DEFAULTS.get(k)
        }
        if isinstance(out.get("max_steps"), int) and out["max_steps"] < 0:
            del out["max_steps"]  # -1: num_train_epochs over the data
        return out

    def _build(self, extra: Mapping[str, Any] | None = None) -> Config:
        data = self.data(extra)
        cfg = build_config(data)
        if not self.paper_terms:
            return cfg
        if cfg.method_spec.buffer != "replay":
            raise ConfigError(
                f"{', '.join(self.paper_terms)} need a replay buffer: use the 'replay' preset "
                "or method__name='replay'"
            )
        for name, value in self.paper_terms.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive number")
            data.setdefault("buffer", {})[name] = float(value)
            section, key = PAPER_TERMS[name].split(".")
            data.setdefault(section, {})[key] = None
        return build_config(data)

    def sets(self, key: str) -> bool:
        """Whether the caller set `key` explicitly (a keyword argument or an override)."""
        if key in self._dotted:
            return True
        if isinstance(self.overrides, Mapping):
            return key in self.overrides
        return any(o.split("=", 1)[0].strip() == key for o in self.overrides)

    @property
    def output_dir(self) -> Path:
        """The run folder: logging.run_dir / logging.name."""
        cfg = self.to_config()
        return Path(cfg.logging.run_dir) / cfg.logging.name

    def trl_args(self) -> dict[str, Any]:
        """The resolved configuration under TRL's argument names (`trainer.args.<name>`).

        Before a trainer has resolved it, a method preset without a `model.path` is read as
        it runs with a model of your own (TRL's defaults for what the preset leaves open:
        learning rate 1e-6, 512 tokens, 8 completions per update); `ReplayTrainer(model=None)`
        (the built-in tiny model) then takes the demo's values, which `trainer.args` reads."""
        cfg = self.resolved
        if cfg is None:
            assumed, self.real_model = self.real_model, True
            try:
                cfg = self.to_config()
            finally:
                self.real_model = assumed
        if self._view[0] is not cfg:  # callbacks read args often: once per resolved config
            self._view = (cfg, trl_view(cfg, self.translation))
        return self._view[1]

    def __getattr__(self, name: str) -> Any:
        # TRL scripts read trainer.args.learning_rate, .max_steps, ...: the resolved values
        if name.startswith("_") or name in ("translation", "trl_values", "resolved", "real_model"):
            raise AttributeError(name)
        view = self.trl_args()
        if name in view:
            return view[name]
        raise AttributeError(
            f"ReplayConfig has no attribute {name!r}"
            + trl_args.suggest(name, [*view, "to_config", "output_dir", "overrides", "preset"])
        )

    def __repr__(self) -> str:
        parts = [repr(self.preset) if not isinstance(self.preset, Config) else "Config(...)"]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        if self.overrides:
            parts.append(f"overrides={self.overrides!r}")
        return f"ReplayConfig({', '.join(parts)})"
