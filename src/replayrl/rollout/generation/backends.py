"""The built-in generation backends, registered by name (`rollout.backend`).

A backend is a builder plus what the run asks of it (`BackendSpec`): whether its log-probs
are the learner's, its truncated-IS default, whether it owns a weight copy, its context bound.
The builders import their engine lazily: reading a config loads neither transformers nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayrl.config.registries import BACKENDS, RUNTIMES, BackendSpec
from replayrl.rollout.generation.vllm_settings import SECTION, VLLMConfig, vllm_settings

if TYPE_CHECKING:
    from replayrl.config.schema import Config
    from replayrl.rollout.generation.base import Generator


def build_hf(
    cfg: Config, model: Any, tokenizer: Any, model_path: str, *, stop_ids: Any, **_: Any
) -> Generator:
    """Generation with the policy itself (transformers; its own decode loop by default); it
    shares the policy's context and random stream (no bound, no seed offset)."""
    from replayrl.models.precision import choose_for, enable_fast_fp32_matmul
    from replayrl.rollout.generation.hf import HFGenerator  # lazy: imports transformers

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
        stop_ids=stop_ids,
    )


def build_vllm(
    cfg: Config,
    model: Any,
    tokenizer: Any,
    model_path: str,
    *,
    max_prompt_len: int | None,
    worker_offset: int,
    stop_ids: Any,
) -> Generator:
    """A vLLM engine loaded from `model_path`; weights follow the policy (`load_weights`).
    With LoRA the engine holds the base model and gets the merged weights W + (alpha/r) B A,
    now and after each step, as TRL does."""
    from pathlib import Path

    from replayrl.models.loading import adapter_base, is_adapter_folder, resolve_model_path
    from replayrl.models.precision import choose_for
    from replayrl.rollout.generation.vllm import VLLMGenerator  # lazy: imports vllm

    lora = cfg.model.lora
    scaling = lora.alpha / lora.r if lora.enabled else None
    if is_adapter_folder(model_path):  # a resumed LoRA policy: the engine loads its base
        model_path = resolve_model_path(adapter_base(Path(model_path)))

    # the engine samples in the precision the HF backend would (bf16 on a CUDA GPU that
    # has it, under precision: auto), never silently in fp32
    chosen = choose_for(cfg.precision, model).generation
    dtype = str(chosen or next(model.parameters()).dtype).removeprefix("torch.")
    settings = vllm_settings(cfg)
    seed = settings.seed if settings.seed is not None else cfg.train.seed + worker_offset
    gen = VLLMGenerator(
        model_path,
        tokenizer,
        settings,
        max_prompt_len=max_prompt_len,
        max_new_tokens=cfg.rollout.max_new_tokens,
        dtype=dtype,
        seed=seed,
        stop_ids=stop_ids,
        lora_scaling=scaling,
        device=next(model.parameters()).device,  # refused unless the engine can sit there
    )
    if scaling is not None:  # the engine holds the base: the adapters' weights go in now
        gen.load_weights(model.named_parameters(), gen.policy_version)
    return gen


def build_vllm_server(
    cfg: Config,
    model: Any,
    tokenizer: Any,
    model_path: str,
    *,
    worker_offset: int,
    stop_ids: Any,
    **_: Any,
) -> Generator:
    """A vLLM server in a process of its own (`replayrl serve-vllm`), reached over HTTP: it
    must serve the run's model (`vllm.server.model`, else the run's model folder or
    `model.path`), and gets the policy's weights now (so a server that served another run or
    an earlier checkpoint samples from this policy) and after every step."""
    from pathlib import Path

    from replayrl.models.loading import adapter_base, is_adapter_folder, resolve_model_path
    from replayrl.rollout.generation.vllm_server import VLLMServerGenerator  # lazy: HTTP

    lora = cfg.model.lora
    scaling = lora.alpha / lora.r if lora.enabled else None
    if is_adapter_folder(model_path):  # a LoRA policy's folder: the server holds its base
        model_path = resolve_model_path(adapter_base(Path(model_path)))
    settings = vllm_settings(cfg)
    expected = [settings.server.model] if settings.server.model else [model_path]
    if not settings.server.model and cfg.model.path:
        # a resumed run loads its checkpoint's folder: the server holds the config's model
        expected.append(resolve_model_path(cfg.model.path))
    gen = VLLMServerGenerator(
        tokenizer,
        settings,
        expected,
        seed=settings.seed if settings.seed is not None else cfg.train.seed + worker_offset,
        stop_ids=stop_ids,
        lora_scaling=scaling,
        tied_head=bool(getattr(model.config, "tie_word_embeddings", False)),
    )
    gen.load_weights(model.named_parameters(), gen.policy_version)
    return gen


def check_vllm_server(cfg: Config) -> None:
    """One server holds one copy of the policy: one generator pushes to it."""
    if not RUNTIMES.get(cfg.runtime).lockstep and cfg.workers.generators > 1:
        raise ValueError(
            f"rollout.backend=vllm_server with workers.generators={cfg.workers.generators}: "
            "every generator would push its own weights into the one server; use "
            "workers.generators=1 (the server batches the prompts itself)"
        )


BACKENDS.add(
    "hf",
    BackendSpec(build_hf, summary="transformers on the policy's own device (CPU or GPU)"),
)
BACKENDS.add(
    "vllm",
    BackendSpec(
        build_vllm,
        # a vLLM engine samples with its own kernels (and dtype): the learner recomputes
        # log pi_old and corrects for the mismatch (on by default, as TRL's
        # vllm_importance_sampling_correction)
        own_logprobs=True,
        truncated_is_cap=lambda cfg: vllm_settings(cfg).truncated_is_cap,
        owns_weights=True,
        needs_gpu=True,
        fallback="hf",
        context_bound=lambda cfg: vllm_settings(cfg).max_model_len is None,
        frames=("/rollout/generation/", "/vllm/"),
        memory_knobs="rollout.decode_batch_size (generation), vllm.gpu_memory_utilization "
        "(vLLM's share of the GPU)",
        section=(SECTION, VLLMConfig),
        summary="a vLLM engine on a GPU (the `vllm` extra; see `vllm`)",
    ),
)
BACKENDS.add(
    "vllm_server",
    BackendSpec(
        build_vllm_server,
        # its own kernels and dtype, as the in-process engine: the learner recomputes log
        # pi_old and corrects the mismatch with vllm.truncated_is_cap
        own_logprobs=True,
        truncated_is_cap=lambda cfg: vllm_settings(cfg).truncated_is_cap,
        owns_weights=True,
        fallback="hf",  # a process that only trains evaluates with its own policy
        memory_knobs="vllm.server.max_concurrent_requests (requests in flight); the server's "
        "own --gpu-memory-utilization",
        check=check_vllm_server,
        section=(SECTION, VLLMConfig),  # the server's address under vllm.server
        summary="a vLLM server in a process of its own, over HTTP (`replayrl serve-vllm`; "
        "TRL's vllm_mode=server)",
    ),
)
