"""Build the rollout backend named by `rollout.backend` (hf or vllm)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from replayrl.config.schema import Config
from replayrl.models.precision import choose_for, enable_fast_fp32_matmul
from replayrl.rollout.generation.base import Generator
from replayrl.rollout.generation.hf import HFGenerator
from replayrl.rollout.generation.stops import stop_token_ids


def make_generator(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    model_path: str,
    *,
    max_prompt_len: int | None = None,
    worker_offset: int = 0,
) -> Generator:
    """The configured Generator; `model` is the transformers model itself (unwrap peft first).

    hf generates with `model`; vllm loads its own engine from `model_path` (weights follow the
    policy through `load_weights`). `max_prompt_len` bounds vLLM's context when
    `vllm.max_model_len` is unset; `worker_offset` is added to `train.seed` for the engine's
    seed (each generator worker samples its own noise). Both backends stop on the same tokens.
    """
    backend = cfg.rollout.backend
    stops = stop_token_ids(model, tokenizer)
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
            stop_ids=stops,
        )
    if backend == "vllm":
        if cfg.model.lora.enabled:
            raise ValueError(
                "rollout.backend=vllm with model.lora.enabled=true is not supported yet "
                "(the engine holds merged weights only): use rollout.backend=hf"
            )
        from replayrl.rollout.generation.vllm import VLLMGenerator  # lazy: imports vllm

        # the engine samples in the precision the HF backend would (bf16 on a CUDA GPU that
        # has it, under precision: auto), never silently in fp32
        chosen = choose_for(cfg.precision, model).generation
        dtype = str(chosen or next(model.parameters()).dtype).removeprefix("torch.")
        seed = cfg.vllm.seed if cfg.vllm.seed is not None else cfg.train.seed + worker_offset
        return VLLMGenerator(
            model_path,
            tokenizer,
            cfg.vllm,
            max_prompt_len=max_prompt_len,
            max_new_tokens=cfg.rollout.max_new_tokens,
            dtype=dtype,
            seed=seed,
            stop_ids=stops,
            device=next(model.parameters()).device,
        )
    raise ValueError(f"rollout.backend: unknown backend {backend!r} (hf or vllm)")
