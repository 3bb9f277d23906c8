"""Build the rollout backend named by `rollout.backend` (hf or vllm)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from replayrl.config.schema import Config
from replayrl.models.precision import choose_for, enable_fast_fp32_matmul
from replayrl.rollout.generation.base import Generator
from replayrl.rollout.generation.hf import HFGenerator


def make_generator(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    model_path: str,
    *,
    max_prompt_len: int | None = None,
) -> Generator:
    """The configured Generator; `model` is the transformers model itself (unwrap peft first).

    hf generates with `model`; vllm loads its own engine from `model_path` (weights follow the
    policy through `load_weights`). `max_prompt_len` bounds vLLM's context when
    `vllm.max_model_len` is unset.
    """
    backend = cfg.rollout.backend
    if backend == "hf":
        if cfg.precision.fast_fp32_matmul:
            enable_fast_fp32_matmul()
        # precision: auto -> bf16 only where the hardware computes it natively (precision.py)
        dtype = choose_for(cfg.precision, model).generation
        return HFGenerator(
            model,
            tokenizer,
            cfg.rollout.decode_batch_size,
            dtype=dtype,
            impl=cfg.rollout.generation_impl,
        )
    if backend == "vllm":
        if cfg.model.lora.enabled:
            raise ValueError(
                "rollout.backend=vllm with model.lora.enabled=true is not supported yet "
                "(the engine holds merged weights only): use rollout.backend=hf"
            )
        from replayrl.rollout.generation.vllm import VLLMGenerator  # lazy: imports vllm

        return VLLMGenerator(
            model_path,
            tokenizer,
            cfg.vllm,
            max_prompt_len=max_prompt_len,
            max_new_tokens=cfg.rollout.max_new_tokens,
            dtype=cfg.model.dtype,
        )
    raise ValueError(f"rollout.backend: unknown backend {backend!r} (hf or vllm)")
