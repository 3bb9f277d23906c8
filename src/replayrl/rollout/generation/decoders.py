"""Incremental decoders for the fast sampling loop (generation/hf.py): prefill, then one token
per row per step, with rows selected (a prompt's cache repeated for its completions, finished
rows dropped) between steps.

- `HFDecoder`: any transformers causal LM through its own forward and KV cache (transformers'
  dynamic cache grows by concatenation: every decode step copies the whole cache).
- `LlamaDecoder`: Llama-architecture models (SmolLM2, Llama 2/3, TinyLlama, ...) run layer
  by layer on the model's own modules (so LoRA-wrapped projections and any dtype work),
  with a KV cache preallocated once for prompt + new tokens and written in place, the
  query heads of a grouped-query attention group batched against their shared key/value
  head (no repeated K/V), a boolean key mask instead of transformers' per-step 4-D masks,
  and logits only for the last position. `llama_core` says whether a model qualifies;
  anything else uses `HFDecoder`.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

# model_type values whose decoder layers are exactly Llama's (pre-norm attention with RoPE,
# no q/k norms, no sliding window, gated MLP): checked again module by module in llama_core
_LLAMA_TYPES = ("llama",)


class Decoder(Protocol):
    def prefill(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run left-padded prompts; return the last position's logits (rows, vocab)."""
        ...

    def select(self, rows: torch.Tensor) -> None:
        """Keep (and repeat) cache rows: row i of the batch becomes old row rows[i]."""
        ...

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row at `positions`; return next-token logits (rows, vocab)."""
        ...


def _cache_of(out) -> object:
    """The KV cache a forward returned (`cache` in transformers >= 5.2x, `past_key_values`
    before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _cache_kwarg(model: torch.nn.Module) -> str:
    """`cache` where forward takes it (it replaced `past_key_values` in transformers 5.2x;
    passing the new name to an older forward would be swallowed by its **kwargs)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFDecoder:
    """Through the model's own forward and (dynamic) KV cache: works for any causal LM."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache: object = None
        self.attention = torch.empty(0)
        self.cache_kw = _cache_kwarg(model)

    def prefill(self, input_ids, attention, positions):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache, self.attention = _cache_of(out), attention
        return out.logits[:, -1]

    def select(self, rows):
        self.cache.batch_select_indices(rows)  # type: ignore[attr-defined]
        self.attention = self.attention[rows]

    def step(self, tokens, positions):
        ones = self.attention.new_ones((self.attention.shape[0], 1))
        self.attention = torch.cat([self.attention, ones], 1)
        out = self.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=self.attention,
            position_ids=positions.unsqueeze(1),
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        return out.logits[:, -1]


def llama_core(
    model: torch.nn.Module,
    types: tuple[str, ...] = _LLAMA_TYPES,
    qk_norm: bool = False,
    sliding_window: bool = False,
) -> torch.nn.Module | None:
    """The Llama-architecture causal LM inside `model` (unwrapping peft), None when `model`
    is anything else (then `HFDecoder` is used). The learner's lean forward accepts more
    (`types`, per-head q/k norms, a sliding window it checks per batch)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    inner = getattr(base, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in types:
        return None
    if not hasattr(base, "lm_head"):
        return None
    if getattr(cfg, "sliding_window", None) and not sliding_window:
        return None
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return None
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
            return None
        if hasattr(attn, "q_norm") and not qk_norm:
            return None
        if not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return None
        if not all(hasattr(layer, m) for m in ("input_layernorm", "post_attention_layernorm")):
            return None
    return base


class LlamaDecoder:
    """Preallocated in-place KV cache and a lean layer loop for Llama-architecture models."""

    float_mask = True  # decode steps share one additive mask across layers (False: boolean)

    def __init__(self, core: torch.nn.Module, max_new_tokens: int) -> None:
        self.core = core
        self.inner = core.model  # type: ignore[union-attr]
        cfg = core.config  # type: ignore[union-attr]
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.inner.layers[0].self_attn.scaling
        self.max_new_tokens = max_new_tokens
        self.k = self.v = torch.empty(0)  # (layers, rows, kv_heads, capacity, head_dim)
        self.valid = torch.empty(0, dtype=torch.bool)  # (rows, capacity): attendable keys
        self.length = 0  # positions filled so far (the same for every row: left padding)

    def _layers(self, h: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> None:
        """Run every layer over h (rows, T, hidden) in place of the hidden state, writing the
        new keys/values at [length, length + T); `mask` is SDPA's boolean mask."""
        rows, t = h.shape[:2]
        start, end = self.length, self.length + t
        cos, sin = self.inner.rotary_emb(h, positions)
        for i, layer in enumerate(self.inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(rows, t, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(rows, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(rows, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.k[i, :, :, start:end] = k
            self.v[i, :, :, start:end] = v
            keys, values = self.k[i, :, :, :end], self.v[i, :, :, :end]
            if t == 1:
                # the query heads sharing a key/value head (head = kv_head * groups + g, as
                # transformers' repeat_kv orders them) become that head's `groups` queries
                q = q.reshape(rows, self.kv_heads, self.groups, self.head_dim)
                o = F.scaled_dot_product_attention(q, keys, values, mask, scale=self.scaling)
            else:
                o = F.scaled_dot_product_attention(
                    q, keys, values, mask, scale=self.scaling, enable_gqa=self.groups > 1
                )
                o = o.transpose(1, 2)
            h = h + attn.o_proj(o.reshape(rows, t, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.length = end
        self._h = h

    def _logits(self) -> torch.Tensor:
        return self.core.lm_head(self.inner.norm(self._h[:, -1]))  # type: ignore[union-attr]

    def prefill(self, input_ids, attention, positions):
        rows, width = input_ids.shape
        emb = self.inner.embed_tokens(input_ids)
        capacity = width + self.max_new_tokens
        shape = (len(self.inner.layers), rows, self.kv_heads, capacity, self.head_dim)
        self.k = emb.new_empty(shape)
        self.v = emb.new_empty(shape)
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, device=emb.device)
        self.valid[:, :width] = attention.bool()
        self.length = 0
        causal = torch.ones((width, width), dtype=torch.bool, device=emb.device).tril_()
        mask = causal & self.valid[:, None, None, :width]
        # a left-pad query sees no key: let it see itself (its output is never used) so
        # that softmax has no empty row (NaN)
        mask |= torch.eye(width, dtype=torch.bool, device=emb.device)
        self._layers(emb, positions, mask)
        return self._logits()

    def select(self, rows):
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
        self.valid = self.valid.index_select(0, rows)

    def step(self, tokens, positions):
        if self.length >= self.k.shape[3]:
            raise RuntimeError("LlamaDecoder: more steps than max_new_tokens")
        self.valid[:, self.length] = True
        mask = self.valid[:, None, None, : self.length + 1]
        emb = self.inner.embed_tokens(tokens.unsqueeze(1))
        if self.float_mask:
            # SDPA turns a boolean mask into this additive one inside every call: build it
            # once per step for all layers instead (bit-identical attention, fewer passes)
            mask = torch.zeros(mask.shape, dtype=emb.dtype, device=emb.device).masked_fill_(
                ~mask, float("-inf")
            )
        self._layers(emb, positions.unsqueeze(1), mask)
        return self._logits()


def make_decoder(model: torch.nn.Module, max_new_tokens: int, lean: bool = True) -> Decoder:
    """`LlamaDecoder` for a Llama-architecture model when `lean`, else `HFDecoder`."""
    core = llama_core(model) if lean else None
    if core is not None:
        return LlamaDecoder(core, max_new_tokens)
    return HFDecoder(model)
