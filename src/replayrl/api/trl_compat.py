"""What a TRL script touches besides the config: transformers `TrainerCallback`s, TRL's names
in `state.log_history`, and `peft_config`.

- `TrainerCallbackAdapter` runs a transformers `TrainerCallback` from replayrl's callback
  points: `on_train_begin`, `on_step_end` then `on_log` (with TRL-named logs) after each step,
  `on_evaluate`, `on_save` after each checkpoint, `on_train_end`; setting
  `control.should_training_stop` stops the run after the step, as under TRL.
- `trl_log` adds TRL's key names (`loss`, `reward`, `learning_rate`, `rewards/<f>/mean`, ...)
  beside replayrl's in a metrics record.
- `lora_overrides` reads a peft `LoraConfig` into `model.lora.*`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from replayrl.config.schema import ConfigError
from replayrl.run import metric_keys
from replayrl.run.callbacks import ReplayCallback

# replayrl metric -> TRL's log key (GRPOTrainer's names): the metric catalogue's, which
# tests/test_metrics_doc.py checks against the keys TRL's source logs
TRL_LOG_KEYS = {m.key: m.trl for m in metric_keys.CATALOGUE if m.trl and "<" not in m.key}
# per reward function: reward/<f> -> rewards/<f>/mean, reward_std/<f> -> rewards/<f>/std
NOT_REWARDS = ("reward/mean", "reward/std")


def trl_log(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with TRL's key names added beside replayrl's (ours are kept)."""
    out = dict(record)
    for ours, theirs in TRL_LOG_KEYS.items():
        if ours in record:
            out[theirs] = record[ours]
    for key, value in record.items():
        if key.count("/") != 1 or key in NOT_REWARDS:
            continue
        kind, name = key.split("/", 1)
        if kind == "reward":
            out[f"rewards/{name}/mean"] = value
        elif kind == "reward_std":
            out[f"rewards/{name}/std"] = value
    return out


def is_trainer_callback(cb: Any) -> bool:
    """A transformers TrainerCallback instance or class."""
    from transformers import TrainerCallback

    return isinstance(cb, TrainerCallback) or (
        isinstance(cb, type) and issubclass(cb, TrainerCallback)
    )


class TrainerCallbackAdapter(ReplayCallback):
    """A transformers `TrainerCallback` called at replayrl's callback points.

    `context()` gives (args, state, control, kwargs) shared by every adapter of a trainer:
    `args` is the trainer's `args` (TRL names read the resolved values), `state` a
    transformers `TrainerState` with `global_step`, `max_steps` and `log_history`, `control`
    a `TrainerControl` whose `should_training_stop` stops the run after the current step.
    """

    def __init__(self, callback: Any, context: Callable[[], tuple[Any, Any, Any, dict]]) -> None:
        self.callback = callback() if isinstance(callback, type) else callback
        self.context = context

    def _call(self, event: str, **extra: Any) -> bool:
        args, state, control, kwargs = self.context()
        method = getattr(self.callback, event, None)
        if method is not None:
            result = method(args, state, control, **kwargs, **extra)
            if result is not None and hasattr(result, "should_training_stop"):
                control = result
        return bool(control.should_training_stop)

    def on_train_begin(self, config: Any) -> None:
        self._call("on_train_begin")

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool | None:
        _, state, _, _ = self.context()
        state.global_step = step
        stop = self._call("on_step_end")
        return self._call("on_log", logs=trl_log(metrics)) or stop

    def on_evaluate(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return self._call("on_evaluate", metrics=trl_log(metrics))

    def on_checkpoint(self, step: int, path: Path) -> bool | None:
        return self._call("on_save")

    def on_train_end(self, summary: dict[str, Any]) -> None:
        self._call("on_train_end")

    def __repr__(self) -> str:
        return f"TrainerCallbackAdapter({type(self.callback).__name__})"


def lora_overrides(peft_config: Any) -> dict[str, Any]:
    """A peft `LoraConfig` -> `model.lora.*` overrides (what TRL's `peft_config=` does)."""
    if peft_config is None:
        return {}
    kind = type(peft_config).__name__
    if kind != "LoraConfig" or not hasattr(peft_config, "r"):
        raise ConfigError(f"peft_config: only a peft LoraConfig is supported (got {kind})")
    targets = peft_config.target_modules
    if isinstance(targets, str) or targets is None:
        raise ConfigError(
            f"peft_config.target_modules={targets!r}: give the module names as a list "
            "(e.g. ['q_proj', 'v_proj'])"
        )
    refused = {
        "bias": "none",
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    bad = [
        f"{k}={getattr(peft_config, k)!r}"
        for k, ok in refused.items()
        if getattr(peft_config, k, ok) not in (ok, [], ())
    ]
    if bad:
        raise ConfigError(f"peft_config: not supported: {', '.join(bad)} (LoRA adapters only)")
    return {
        "model.lora.enabled": True,
        "model.lora.r": int(peft_config.r),
        "model.lora.alpha": int(peft_config.lora_alpha),
        "model.lora.dropout": float(peft_config.lora_dropout),
        "model.lora.target_modules": sorted(targets),
    }
