"""The policy a run trains: `model.path` (a folder, a prepared model's name, a hub id or a
LoRA adapter folder), else the tiny model's cached warm start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from replayrl.config.schema import ModelConfig, TaskConfig
from replayrl.models.loading import load_pretrained_policy, resolve_model_path
from replayrl.run.warmstart import ensure_sft_warmup, ensure_warmstart


def load_policy(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    log: Callable[[str], object] = print,
    adapter: str | Path | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, str]:
    """The policy to train and its tokenizer: `model.path` if set (after its supervised
    warm-up when `model.sft.steps` > 0), else the tiny warm start.

    With `model.lora.enabled` the model comes back wrapped in fresh LoRA adapters (drawn
    from `seed`), or in the saved ones of `adapter` (resume). A `model.path` that is itself
    an adapter folder loads its base model (named in adapter_config.json) with the adapter
    on top. `model.gradient_checkpointing` switches it on for the policy. A warm-up that
    is not cached yet trains on `device` (the run's train.device); the policy comes back on
    the CPU, for the caller to place.
    """
    path = policy_folder(cfg, task_cfg, log, device)
    return load_pretrained_policy(path, cfg, adapter=adapter, seed=seed)


def policy_folder(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    log: Callable[[str], object] = print,
    device: torch.device | str = "cpu",
) -> str:
    """The folder (or hub id) a run's starting policy loads from: `model.path` resolved, or
    its supervised warm-up's cached folder when `model.sft.steps` > 0, else the tiny model's
    cached warm start (either built on `device` when not cached yet)."""
    device = torch.device(device)
    if not cfg.path:
        return str(ensure_warmstart(cfg, task_cfg, log, device))
    path = resolve_model_path(cfg.path)
    if cfg.sft.steps:  # the supervised warm-up of model.path (cached)
        path = str(ensure_sft_warmup(path, cfg, task_cfg, log, device))
    return path
