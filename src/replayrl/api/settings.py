"""The settings table a trainer prints when training starts: every setting, under TRL's
argument name, whose value in this run differs from what the caller passed or (not passed)
from TRL's default, with who set it. A TRL user sees at once what a preset, the demo's tiny
model or a recount of TRL's step counts changed, instead of finding it in config.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from replayrl.api import trl_args
from replayrl.api.config import ReplayConfig, updates_per_step
from replayrl.config.layering import layered
from replayrl.config.schema import Config

# TRL's defaults for the view's names that TRL_DEFAULTS leaves out (TRL 1.16's GRPOConfig:
# generation_batch_size = per_device_train_batch_size x steps_per_generation = 8 x 1)
MORE_DEFAULTS: dict[str, Any] = {
    "generation_batch_size": 8,
    "steps_per_generation": 1,
    "warmup_ratio": 0.0,
    "epsilon_high": None,
    "save_total_limit": None,
    "eval_steps": None,
    "disable_tqdm": False,
    "min_p": None,
    "repetition_penalty": 1.0,
    "importance_sampling_level": "token",
    "mask_truncated_completions": False,
}
# not settings of the training: where it writes and how it is named
SKIP = frozenset({"output_dir", "run_name", "logging_steps"})
# the replayrl key behind each TRL name (for who set it)
KEYS: dict[str, str] = {
    **trl_args.DIRECT,
    "max_steps": "train.steps",
    "lr_scheduler_type": "train.lr_scheduler",
    "warmup_steps": "train.warmup_steps",
    "per_device_train_batch_size": "train.mini_batch_size",
    "steps_per_generation": "train.mini_batch_size",
    "generation_batch_size": "rollout.prompts_per_step",
    "num_iterations": "train.epochs",
    "loss_type": "algorithm.loss_agg",
    "scale_rewards": "algorithm.scale_rewards",
    "bf16": "precision.learner_autocast",
    "save_steps": "checkpoint.every",
    "save_strategy": "checkpoint.every",
    "eval_strategy": "eval.every",
    "eval_steps": "eval.every",
    "report_to": "logging.tensorboard",
    "disable_tqdm": "logging.progress",
}
NOT_PASSED = "-"


@dataclass(frozen=True)
class Setting:
    """One row: a TRL argument, its value in this run, TRL's default, what was passed (or
    NOT_PASSED) and who set the value."""

    name: str
    used: Any
    trl_default: Any
    passed: Any
    source: str


def _sinks(value: Any) -> Any:
    """report_to's forms of one choice: "none", [] and None; "x" and ["x"]."""
    sinks = {value} if isinstance(value, str) else set(value or [])
    sinks.discard("none")
    return sinks


def _same(a: Any, b: Any, name: str = "") -> bool:
    if name == "report_to":
        return _sinks(a) == _sinks(b)
    a, b = trl_args.plain(a), trl_args.plain(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, bool) or isinstance(b, bool):
            return a is b or a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return bool(a == b)


def _layer_sources(args: ReplayConfig, cfg: Config) -> dict[str, str]:
    """dotted key -> the layer that set it (method preset, experiment, TRL defaults layer)."""
    if args.preset is None or isinstance(args.preset, Config):
        return {}
    model = cfg.model.path if cfg.model.path is not None else None
    if model is None and args.real_model:
        model = "(a model object)"
    try:
        return layered(str(args.preset), model)[1]
    except Exception:  # a source column is a courtesy: never fail a run for it
        return {}


def _source(name: str, args: ReplayConfig, layers: dict[str, str]) -> str:
    key = KEYS.get(name)
    if name == "num_iterations" and args.resolved is not None:
        key = args.resolved.method_spec.passes_key
    if name == "max_steps" and args.translation.epochs_to_steps is not None:
        return "num_train_epochs over the dataset"
    if name in ("max_steps", "save_steps", "eval_steps") and name in args.trl_values:
        return "TRL's count of updates, in whole steps"
    if key is not None and args.sets(key):
        return f"you ({key})"
    where = layers.get(key or "")
    preset = args.preset if isinstance(args.preset, str) else "the preset"
    if where == "method":
        return f"preset {preset} ({key})"
    if where == "experiment":
        return f"the built-in tiny model's experiment ({key})"
    if where == "default (TRL)":
        return f"TRL's defaults for your model ({key})"
    return f"replayrl's default ({key})" if key else "replayrl"


def settings(args: ReplayConfig, cfg: Config) -> list[Setting]:
    """The rows of the table: settings whose value here differs from what was passed, or,
    not passed, from TRL's default."""
    view = args.trl_args()
    defaults = {**MORE_DEFAULTS, **trl_args.TRL_DEFAULTS}
    passed = args.trl_values
    layers = _layer_sources(args, cfg)
    rows = []
    for name, used in view.items():
        if name in SKIP or (name not in passed and name not in defaults):
            continue
        if name in passed:
            if _same(used, passed[name], name):
                continue
        elif _same(used, defaults[name], name):
            continue
        given = passed.get(name, NOT_PASSED)
        source = _source(name, args, layers)
        if name == "max_steps" and used is None:  # steps take varying numbers of updates
            used, source = f"{cfg.train.steps} steps", f"{source}: {updates_per_step(cfg)[1]}"
        rows.append(Setting(name, used, defaults.get(name), given, source))
    return rows


def _text(value: Any) -> str:
    value = trl_args.plain(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_table(args: ReplayConfig, cfg: Config) -> str:
    """The table as text (printed once when training starts); '' when nothing differs."""
    rows = settings(args, cfg)
    if not rows:
        return ""
    head = ("argument (TRL name)", "this run", "TRL default", "you passed", "set by")
    cells = [head] + [
        (r.name, _text(r.used), _text(r.trl_default), _text(r.passed), r.source) for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  " + "  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells]
    title = "settings that differ from TRL's defaults or from what you passed:"
    return "\n".join([title, *lines])
