"""`ReplayConfig`: a run's configuration for the Python API, the counterpart of TRL's
`GRPOConfig` (a preset, TRL-named keyword arguments, replayrl keys, dotted overrides)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from replayrl.config.schema import Config, ConfigError, apply_overrides, build_config, load_yaml

# TRL GRPOConfig names -> replayrl config keys (same meaning)
TRL_KEYS: dict[str, str] = {
    "max_steps": "train.steps",
    "learning_rate": "train.lr",
    "weight_decay": "train.weight_decay",
    "max_grad_norm": "train.max_grad_norm",
    "seed": "train.seed",
    "num_iterations": "train.epochs",
    "num_generations": "rollout.num_generations",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "beta": "kl.beta",
    "epsilon": "algorithm.epsilon",
    "epsilon_high": "algorithm.epsilon_high",
    "eval_steps": "eval.every",
    "save_steps": "checkpoint.every",
    "save_total_limit": "checkpoint.keep_last",
}
# handled one by one in ReplayConfig._trl_overrides
TRL_SPECIAL = (
    "output_dir",
    "generation_batch_size",
    "scale_rewards",
    "report_to",
    "disable_tqdm",
    "reward_weights",
)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """data['a']['b'] = value for key 'a.b' (sections created as needed)."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override {key!r} has an empty key")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {'.'.join(parts[: i + 1])} is a value")
        node = child
    node[parts[-1]] = value


class ReplayConfig:
    """A run's configuration: a preset plus overrides (the counterpart of TRL's `GRPOConfig`).

    Args:
        preset: a shipped preset name (`replayrl presets`: "grpo", "replay", "remix-grpo",
            ...), a YAML file, a `Config` object, or None for the built-in defaults.
        overrides: dotted overrides applied last, as a list of "key=value" strings (the CLI's
            syntax: `["buffer.capacity=512", "train.lr=1e-4"]`) or a mapping
            `{"buffer.capacity": 512}`.
        **kwargs: TRL `GRPOConfig` names (`output_dir`, `max_steps`, `learning_rate`,
            `num_generations`, `max_completion_length`, `temperature`, `top_p`, `beta`,
            `epsilon`, `epsilon_high`, `weight_decay`, `max_grad_norm`, `seed`,
            `num_iterations`, `eval_steps`, `save_steps`, `save_total_limit`,
            `generation_batch_size` (completions per step, a multiple of num_generations),
            `scale_rewards` ("group"/"none"/bool), `report_to` ("wandb", "tensorboard",
            "none" or a list), `disable_tqdm`, `reward_weights`), or replayrl keys with `__`
            for the dot: `buffer__kind="replay"`, `remix__utd=2`. Unknown names are an error.

    `output_dir` is the run folder (metrics.jsonl, summary.json, checkpoints/): it sets
    `logging.run_dir` (its parent) and `logging.name` (its last part). Validation happens when
    the config is resolved (`to_config()`, or when a `ReplayTrainer` is built), with errors
    naming the key.

    Example: `ReplayConfig("remix-grpo", output_dir="runs/mine", max_steps=200,
    learning_rate=1e-6, overrides=["remix.off_policy_fraction=0.5"])`.
    """

    def __init__(
        self,
        preset: str | PathLike[str] | Config | None = None,
        overrides: Sequence[str] | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if preset is not None and not isinstance(preset, (str, PathLike, Config)):
            raise TypeError(
                f"preset must be a preset name, a YAML path or a Config (got {type(preset)})"
            )
        self.preset = preset
        if isinstance(overrides, str):
            raise TypeError("overrides must be a list of 'key=value' strings or a mapping")
        self.overrides = overrides if overrides is not None else []
        self.kwargs = dict(kwargs)
        self.reward_weights: list[float] | None = None
        self._dotted = self._keyword_overrides(self.kwargs)

    def _keyword_overrides(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        unknown = []
        for name, value in kwargs.items():
            if name in TRL_KEYS:
                out[TRL_KEYS[name]] = value
            elif name in TRL_SPECIAL:
                out.update(self._trl_special(name, value, kwargs))
            elif "__" in name:
                out[name.replace("__", ".")] = value
            else:
                unknown.append(name)
        if unknown:
            known = ", ".join([*TRL_KEYS, *TRL_SPECIAL])
            raise ConfigError(
                f"ReplayConfig: unknown argument(s) {', '.join(unknown)} (TRL names known here: "
                f"{known}; replayrl keys as section__key, e.g. buffer__kind, or overrides=[...])"
            )
        return out

    def _trl_special(self, name: str, value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if name == "output_dir":
            path = Path(value).expanduser()
            if not path.name or path.name in (".", ".."):
                raise ConfigError(f"output_dir={value!r} must end in a folder name")
            return {"logging.run_dir": str(path.parent), "logging.name": path.name}
        if name == "generation_batch_size":
            g = kwargs.get("num_generations")
            if g is None:
                raise ConfigError(
                    "generation_batch_size needs num_generations beside it (prompts per step "
                    "= generation_batch_size / num_generations)"
                )
            if not isinstance(value, int) or value < g or value % g:
                raise ConfigError(
                    f"generation_batch_size={value!r} must be a positive multiple of "
                    f"num_generations={g}"
                )
            return {"rollout.prompts_per_step": value // g}
        if name == "scale_rewards":
            mapping = {True: True, False: False, "group": True, "none": False}
            if value not in mapping or (isinstance(value, int) and not isinstance(value, bool)):
                raise ConfigError(
                    f"scale_rewards={value!r}: replayrl normalises per group ('group' / True) or "
                    "not at all ('none' / False)"
                )
            return {"algorithm.scale_rewards": mapping[value]}
        if name == "report_to":
            sinks = [value] if isinstance(value, str) else list(value or [])
            bad = [s for s in sinks if s not in ("wandb", "tensorboard", "none", "all")]
            if bad:
                raise ConfigError(
                    f"report_to: unknown {bad} (replayrl logs to: wandb, tensorboard, none; "
                    "metrics.jsonl is always written)"
                )
            every = "all" in sinks
            return {
                "logging.wandb": every or "wandb" in sinks,
                "logging.tensorboard": every or "tensorboard" in sinks,
            }
        if name == "disable_tqdm":
            return {"logging.progress": not value}
        # reward_weights: applied by ReplayTrainer to its reward functions
        weights = [float(w) for w in value] if value is not None else None
        self.reward_weights = weights
        return {}

    def _base(self) -> dict[str, Any]:
        if isinstance(self.preset, Config):
            return self.preset.model_dump(mode="json")
        return load_yaml(self.preset) if self.preset is not None else {}

    def override_strings(self) -> list[str]:
        """Every override as a CLI-style "key=value" string (JSON values are valid YAML)."""
        out = [f"{k}={json.dumps(v)}" for k, v in self._dotted.items()]
        if isinstance(self.overrides, Mapping):
            out += [f"{k}={json.dumps(v)}" for k, v in self.overrides.items()]
        else:
            out += list(self.overrides)
        return out

    def data(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The config as a nested dict: preset <- keyword arguments <- overrides <- `extra`."""
        data = self._base()
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
        """The validated `Config` (ConfigError naming the key and value when invalid)."""
        return build_config(self.data(extra))

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

    def __repr__(self) -> str:
        parts = [repr(self.preset) if not isinstance(self.preset, Config) else "Config(...)"]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        if self.overrides:
            parts.append(f"overrides={self.overrides!r}")
        return f"ReplayConfig({', '.join(parts)})"
