"""Build the rollout backend named by `rollout.backend` (a `BACKENDS` registry name)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayrl.config.registries import BACKENDS
from replayrl.rollout.generation.stops import stop_token_ids

if TYPE_CHECKING:
    from replayrl.config.schema import Config
    from replayrl.rollout.generation.base import Generator


def make_generator(
    cfg: Config,
    model: Any,
    tokenizer: Any,
    model_path: str,
    *,
    max_prompt_len: int | None = None,
    worker_offset: int = 0,
) -> Generator:
    """The configured Generator; `model` is the transformers model itself (unwrap peft first).

    hf generates with `model`; vllm loads its own engine from `model_path` (weights follow the
    policy through `load_weights`). `max_prompt_len` bounds a backend's context (vLLM's, when
    `vllm.max_model_len` is unset); `worker_offset` is added to `train.seed` for an engine's
    seed (each generator worker samples its own noise). Every backend stops on the same tokens.
    """
    spec = BACKENDS.get(cfg.rollout.backend)
    return spec.build(  # type: ignore[no-any-return]
        cfg,
        model,
        tokenizer,
        model_path,
        max_prompt_len=max_prompt_len,
        worker_offset=worker_offset,
        stop_ids=stop_token_ids(model, tokenizer),
    )
