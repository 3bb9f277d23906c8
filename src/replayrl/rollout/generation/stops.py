"""The tokens that end a completion, the same for every backend."""

from __future__ import annotations

from typing import Any


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if v is not None]


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokenizer's EOS, then every `generation_config.eos_token_id` of the model (a list
    on Qwen and Llama-3 chat models: <|im_end|> / <|eot_id|> beside <|endoftext|>), without
    repeats. vLLM stops on all of them by itself; the HF backend is given the same list, so
    both backends end completions at the same tokens."""
    out = _ids(getattr(tokenizer, "eos_token_id", None))
    gen_cfg = getattr(model, "generation_config", None)
    for tok in _ids(getattr(gen_cfg, "eos_token_id", None)):
        if tok not in out:
            out.append(tok)
    return out


def cut_at_stop(
    token_ids: list[int], logprobs: list[float], stop_ids: list[int]
) -> tuple[list[int], list[float], bool]:
    """Token ids and log-probs up to and including the first stop token, and whether one
    was met (vLLM stops on a stop token and keeps it; a completion is cut there anyway)."""
    stop = set(stop_ids)
    for i, tok in enumerate(token_ids):
        if tok in stop:
            return token_ids[: i + 1], logprobs[: i + 1], True
    return token_ids, logprobs, False
