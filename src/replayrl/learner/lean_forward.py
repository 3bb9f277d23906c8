"""A lean training forward for Llama-architecture policies (Llama, Mistral, Qwen2/2.5 with
their q/k/v biases, Qwen3 with its per-head q/k norms): the hidden states that predict
completion tokens, with each distinct prompt run once for all the rollouts that share it.

The learner needs log pi(completion token) only. transformers' forward runs every row's
prompt again (a GRPO group of G completions repeats its prompt G times), builds 4-D masks,
and under bf16 autocast re-casts every frozen weight on every call and every activation
once per projection. Here, layer by layer on the model's own modules (autograd intact, so
LoRA adapters and full fine-tuning both train through it):

- the distinct prompts run once (left-padded, causal), and each completion attends to its
  prompt's keys/values (gathered per row: the gradient of a shared prompt sums over its
  completions, exactly as when every row recomputes it) and causally to itself;
- the last completion token is never an input (it predicts nothing the loss uses);
- under autocast, frozen weights (LoRA's base, a frozen head) are cast to the autocast dtype
  once and cached until they change; each normalised activation is cast once for all the
  projections that read it (the same roundings autocast would do: same values);
- peft LoRA projections run as base + B(A(dropout(x))) * scaling without peft's round trip
  of the input through fp32.

Attention keeps the fused SDPA kernels: a pass without padding inside its attended span
(every prompt of one length) runs causal with no mask (top-left causal for the prompts,
bottom-right for completions after their prompt); otherwise K/V are expanded to the query
heads and a boolean mask is passed, a layout the memory-efficient kernel accepts (a mask with
`enable_gqa` leaves only the math kernel, which keeps T x T weights per layer). Where no fused
CUDA kernel takes GQA (fp32, or a GPU older than sm80) the mask-free prompt pass expands them
too (`fused_gqa_kernel`). With the
model's gradient checkpointing on (`model.gradient_checkpointing`), each decoder layer runs
under `torch.utils.checkpoint`: backward keeps only the layers' inputs.

Sharded policies (FSDP2): each decoder layer runs as a forward method of its shard group
(`replayrl_run`, run/distributed/fsdp.py), so its weights are gathered around it as around
`layer(...)`, and no frozen weight is cached (a cast copy of a gathered weight would be a
whole layer kept on every rank).

Same log-probs and gradients as transformers' forward up to float rounding
(tests/test_lean_forward.py); `completion_states` is checked once per model against
transformers' own forward on a short input and is used only where it matches.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.nn.attention.bias import causal_lower_right
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from replayrl.learner.batching import TokenRows
from replayrl.models.loading import LEAN_ATTR
from replayrl.rollout.generation.decoders import llama_core

# model_type values whose decoder layers are Llama's up to what this module runs: biases on
# the projections (Qwen2/2.5), per-head RMSNorm of q and k before the rotary embedding
# (Qwen3), a sliding window (Mistral; used only where every row fits in it). Checked again
# module by module (`decoders.llama_core`) and against transformers' forward once per model.
LEAN_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_sharded_depth = 0
# pack rows run whole without padding (`_Layout.segments`): same values up to float rounding
# (~1e-5 on log-probs, other matmul shapes) and no [rows, 1, T, T] mask, but one attention
# call per row and layer; off by default until measured against the padded layout
PACK_ROWS = False

_WEIGHTS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, torch.dtype, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def _weight(mod: torch.nn.Linear, dtype: torch.dtype | None) -> torch.Tensor:
    """The weight to multiply by: a frozen weight is cast to the autocast dtype once and kept
    until it changes (its version counter moves on any in-place update); a trained weight is
    left to autocast (its cast must stay in the autograd graph)."""
    w = mod.weight
    if dtype is None or w.requires_grad or w.dtype == dtype:
        return w
    if _sharded_depth:  # a gathered weight is freed after its layer: cast it, keep nothing
        return w.to(dtype)
    hit = _WEIGHTS.get(mod)
    if hit is not None and hit[0] == w._version and hit[1] == dtype:
        return hit[2]
    cast = w.detach().to(dtype)
    _WEIGHTS[mod] = (w._version, dtype, cast)
    return cast


def _plain(mod: torch.nn.Linear, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return F.linear(x, _weight(mod, dtype), mod.bias)


def _simple_lora(mod: torch.nn.Module) -> bool:
    """A peft LoRA Linear that this module can run itself: plain Linear base, not merged,
    vanilla LoRA (no DoRA or other variant) on every active adapter."""
    base = getattr(mod, "base_layer", None)
    if type(base) is not torch.nn.Linear or getattr(mod, "merged", True):
        return False
    variants = getattr(mod, "lora_variant", {})
    for name in ("lora_A", "lora_B", "scaling", "lora_dropout", "active_adapters"):
        if not hasattr(mod, name):
            return False
    return not any(a in variants for a in mod.active_adapters)


def linear(mod: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """mod(x) for an nn.Linear or a peft LoRA Linear (other modules: called as they are)."""
    if type(mod) is torch.nn.Linear:
        return _plain(mod, x, dtype)
    if not _simple_lora(mod):
        return mod(x)
    y = _plain(mod.base_layer, x, dtype)  # type: ignore[arg-type]
    if mod.disable_adapters:  # type: ignore[union-attr]
        return y
    for a in mod.active_adapters:  # type: ignore[union-attr]
        if a in mod.lora_A:  # type: ignore[operator]
            drop = mod.lora_dropout[a](x)  # type: ignore[index]
            y = y + mod.lora_B[a](mod.lora_A[a](drop)) * mod.scaling[a]  # type: ignore[index]
    return y


def _mlp(mlp: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return mlp(x)
    gate = linear(mlp.gate_proj, x, dtype)
    return linear(mlp.down_proj, mlp.act_fn(gate) * linear(mlp.up_proj, x, dtype), dtype)


@contextlib.contextmanager
def sharded() -> Iterator[None]:
    """Inside this block the policy is sharded: frozen weights are cast per use, not cached."""
    global _sharded_depth
    _sharded_depth += 1
    try:
        yield
    finally:
        _sharded_depth -= 1


def fits(core: torch.nn.Module, batch: TokenRows) -> bool:
    """Whether `batch`'s rows fit the model's sliding window (a row no longer than the
    window attends to every earlier token, as full causal attention does)."""
    window = getattr(core.config, "sliding_window", None)
    return window is None or batch.input_ids.shape[1] <= int(window)


def lean_core(model: object) -> torch.nn.Module | None:
    """The causal LM inside `model` when the lean forward applies to it (a module of a type
    in LEAN_TYPES without attention dropout), else None."""
    if not isinstance(model, torch.nn.Module):
        return None
    core = llama_core(model, LEAN_TYPES, qk_norm=True, sliding_window=True)
    if core is None or getattr(core.config, "attention_dropout", 0.0):
        return None
    if not getattr(core, LEAN_ATTR, True):  # switched off by `model.lean_forward: false`
        return None
    return core


# run shared prompts once only when that saves at least this share of the tokens: two
# passes of smaller matmuls cost more than one pass when little is shared
_SHARE_MIN = 0.2


class _Layout:
    """Where each row's inputs go (from a `collate` batch): with enough shared prompts, the
        distinct prompts (left-padded) and then each row's completion inputs; otherwise each row
        whole (`shared` False, no completion pass): packed into one row without padding when their
    lengths differ (`segments`), else one unpadded pass."""

    def __init__(self, batch: TokenRows, share: bool | None = None, pack: bool = False) -> None:
        ids = batch.input_ids
        sel = batch.mask.bool()
        device = ids.device
        n = ids.shape[0]
        lengths = sel.sum(1)
        if bool((lengths == 0).any()):
            raise ValueError("lean forward: a row without completion tokens")
        # mask[i, p - 1] is the first completion target: p = prompt length
        first = sel.float().argmax(1)
        plen = (first + 1).tolist()
        clen = lengths.tolist()
        # rows with the same prompt share one prompt pass
        index: dict[tuple[int, ...], int] = {}
        group = []
        prompts: list[torch.Tensor] = []
        for i in range(n):
            p = ids[i, : plen[i]]
            key = tuple(p.tolist())
            if key not in index:
                index[key] = len(prompts)
                prompts.append(p)
            group.append(index[key])
        total = sum(plen) + sum(clen) - n
        saved = sum(plen) - sum(p.numel() for p in prompts)
        self.shared = saved >= _SHARE_MIN * total if share is None else share
        if not self.shared:  # each row's inputs: prompt + completion tokens 0 .. c - 2
            prompts = [ids[i, : plen[i] + clen[i] - 1] for i in range(n)]
            group = list(range(n))
            clen_in = [1] * n  # no completion pass
        else:
            clen_in = clen
        self.group = torch.tensor(group, device=device)
        # rows of different lengths run whole: packed into one row without padding, each
        # attending causally within its own segment (positions restart per row), so nothing
        # grows with rows x longest row (no [rows, 1, T, T] mask)
        self.segments: list[int] | None = None
        if pack and not self.shared and len({p.numel() for p in prompts}) > 1:
            self.segments = [p.numel() for p in prompts]
            ends = torch.tensor(self.segments, device=device).cumsum(0)
            self.out_index = torch.cat(
                [
                    torch.arange(int(e) - c, int(e), device=device)
                    for e, c in zip(ends, clen, strict=True)
                ]
            )
            prompts = [torch.cat(prompts)]
        width = max(p.numel() for p in prompts)
        u = len(prompts)
        self.prompt_ids = torch.zeros((u, width), dtype=ids.dtype, device=device)
        self.prompt_valid = torch.zeros((u, width), dtype=torch.bool, device=device)
        for j, p in enumerate(prompts):  # left padding: every prompt ends at column width - 1
            self.prompt_ids[j, width - p.numel() :] = p
            self.prompt_valid[j, width - p.numel() :] = True
        self.prompt_pos = (self.prompt_valid.long().cumsum(1) - 1).clamp_(min=0)
        if self.segments is not None:
            self.prompt_pos = torch.cat([torch.arange(t, device=device) for t in self.segments])[
                None
            ]
        # completion inputs: tokens 0 .. c - 2 (the last one predicts nothing used)
        cw = max(clen_in) - 1
        self.comp_ids = torch.zeros((n, cw), dtype=ids.dtype, device=device)
        for i in range(n):
            p, c = plen[i], clen_in[i]
            self.comp_ids[i, : c - 1] = ids[i, p : p + c - 1]
        starts = torch.tensor(plen, device=device)
        self.comp_pos = starts[:, None] + torch.arange(cw, device=device)
        if self.shared:
            # output rows: [the prompt's last state, completion states 0 .. c - 2] per row
            self.out_sel = torch.arange(cw + 1, device=device)[None, :] < lengths[:, None]
        else:
            # output rows: each row's last c states (it ends at the last column)
            cmax = max(clen)
            self.out_sel = torch.arange(cmax, device=device)[None, :] >= cmax - lengths[:, None]


def fused_gqa_kernel(
    device_type: str, dtype: torch.dtype, capability: tuple[int, int], head_dim: int
) -> bool:
    """Whether a fused SDPA kernel takes grouped K/V heads (`enable_gqa`). On CUDA only
    FlashAttention and cuDNN attention do, both fp16/bf16 only, FlashAttention from sm80 on
    with head_dim a multiple of 8 up to 256; anything else falls to the math kernel, which
    keeps rows x heads x T x T weights per layer (a Qwen2.5-0.5B-shaped fp32 step of 8 rows x
    4k tokens peaked at 34.7 GiB on an H200 that way, 9.8 GiB with K/V expanded). The CPU's
    fused kernel takes GQA."""
    if device_type != "cuda":
        return True
    half = dtype in (torch.float16, torch.bfloat16)
    return half and capability >= (8, 0) and head_dim % 8 == 0 and head_dim <= 256


def _kernel_takes_gqa(q: torch.Tensor) -> bool:
    capability = torch.cuda.get_device_capability(q.device) if q.is_cuda else (0, 0)
    return fused_gqa_kernel(q.device.type, q.dtype, capability, q.shape[-1])


def _sdpa(q, keys, values, mask, scale, heads, kv_heads):
    """SDPA in a form its fused kernels accept. `mask`: "causal" (queries and keys aligned
    at the start), "lower_right" (the queries are the last keys), or a boolean mask."""
    gqa = heads != kv_heads
    causal = isinstance(mask, str) and mask == "causal"
    if causal and (not gqa or _kernel_takes_gqa(q)):
        return F.scaled_dot_product_attention(
            q, keys, values, is_causal=True, scale=scale, enable_gqa=gqa
        )
    if gqa:  # the memory-efficient kernel takes a mask and fp32 but not GQA
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
    if causal:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale)
    if isinstance(mask, str):  # "lower_right"
        mask = causal_lower_right(q.shape[2], keys.shape[2])
    return F.scaled_dot_product_attention(q, keys, values, mask, scale=scale)


def _attention(attn, x, cos, sin, keys_extra, mask, heads, kv_heads, head_dim):
    """q/k/v projections with rotary embeddings and SDPA; returns (output, k, v)."""
    rows, t = x.shape[:2]
    dtype = autocast_dtype(x.device)
    q = linear(attn.q_proj, x, dtype).view(rows, t, heads, head_dim)
    k = linear(attn.k_proj, x, dtype).view(rows, t, kv_heads, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's q and k, before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = linear(attn.v_proj, x, dtype).view(rows, t, kv_heads, head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = k, v
    if keys_extra is not None:
        pk, pv = keys_extra
        keys, values = torch.cat([pk, k.to(pk.dtype)], 2), torch.cat([pv, v.to(pv.dtype)], 2)
    if dtype is not None:  # autocast would cast them for SDPA: do it once, same values
        q, keys, values = q.to(dtype), keys.to(dtype), values.to(dtype)
    if isinstance(mask, list):  # packed rows: causal attention within each row's segment
        parts = zip(q.split(mask, 2), keys.split(mask, 2), values.split(mask, 2), strict=True)
        o = torch.cat(
            [_sdpa(a, b, c, "causal", attn.scaling, heads, kv_heads) for a, b, c in parts], 2
        )
    else:
        o = _sdpa(q, keys, values, mask, attn.scaling, heads, kv_heads)
    o = o.transpose(1, 2).reshape(rows, t, heads * head_dim)
    return linear(attn.o_proj, o, dtype), k, v


def _attention_masks(
    lay: _Layout,
) -> tuple[torch.Tensor | str | list[int], torch.Tensor | str]:
    """(the prompts' attention mask, the completions'): causal (packed: per segment) unless
    prompts are left-padded. Completions are right-padded: a pad key is seen only by later
    (pad) queries, so only prompt padding needs a mask."""
    mask_p: torch.Tensor | str | list[int] = "causal" if lay.segments is None else lay.segments
    mask_c: torch.Tensor | str = "lower_right"
    if bool(lay.prompt_valid.all()):
        return mask_p, mask_c
    device = lay.prompt_ids.device
    wp, (n, wc) = lay.prompt_ids.shape[1], lay.comp_ids.shape
    # a left-pad query sees no key: let it see itself (its output is never used) so that
    # softmax has no empty row (a NaN there would reach the gradients through 0 * NaN)
    eye = torch.eye(wp, dtype=torch.bool, device=device)
    causal_p = torch.ones((wp, wp), dtype=torch.bool, device=device).tril_()
    mask_p = (causal_p & lay.prompt_valid[:, None, None, :]) | eye
    if wc > 0:
        causal_c = torch.ones((wc, wc), dtype=torch.bool, device=device).tril_()
        mask_c = torch.cat(
            [
                lay.prompt_valid[lay.group][:, None, None, :].expand(n, 1, wc, wp),
                causal_c[None, None].expand(n, 1, wc, wc),
            ],
            dim=-1,
        )
    return mask_p, mask_c


def completion_states(
    core: torch.nn.Module,
    batch: TokenRows,
    share: bool | None = None,
    pack: bool | None = None,
) -> torch.Tensor:
    """Final-normed hidden states that predict each completion token of `batch` (a `collate`
    batch: right-padded prompt + completion rows, `mask` on completion targets), shape
    (completion tokens, hidden), in the order of `batch.mask.bool()`. `share`: run shared
    prompts once (None: when that saves enough tokens). `pack`: rows run whole are packed
    without padding (False: left-padded with a mask; None: `PACK_ROWS`)."""
    inner = core.model  # type: ignore[union-attr]
    cfg = core.config  # type: ignore[union-attr]
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    lay = _Layout(batch, share, PACK_ROWS if pack is None else pack)
    device = lay.prompt_ids.device
    dtype = autocast_dtype(device)
    u, wp = lay.prompt_ids.shape
    n, wc = lay.comp_ids.shape
    hp = inner.embed_tokens(lay.prompt_ids)
    cos_p, sin_p = inner.rotary_emb(hp, lay.prompt_pos)
    mask_p, mask_c = _attention_masks(lay)
    hc = cos_c = sin_c = None
    if wc > 0:
        hc = inner.embed_tokens(lay.comp_ids)
        cos_c, sin_c = inner.rotary_emb(hc, lay.comp_pos)

    def norm_cast(norm: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        x = norm(h)
        return x if dtype is None else x.to(dtype)

    def run_layer(layer, hp, hc):
        attn = layer.self_attn
        x = norm_cast(layer.input_layernorm, hp)
        o, kp, vp = _attention(attn, x, cos_p, sin_p, None, mask_p, heads, kv_heads, head_dim)
        hp = hp + o
        if hc is not None:
            x = norm_cast(layer.input_layernorm, hc)
            extra = (kp[lay.group], vp[lay.group])
            o, _, _ = _attention(attn, x, cos_c, sin_c, extra, mask_c, heads, kv_heads, head_dim)
            hc = hc + o
            hc = hc + _mlp(layer.mlp, norm_cast(layer.post_attention_layernorm, hc), dtype)
        hp = hp + _mlp(layer.mlp, norm_cast(layer.post_attention_layernorm, hp), dtype)
        return hp, hc

    # the model's own switch (gradient_checkpointing_enable sets it on the decoder)
    checkpointed = bool(getattr(inner, "gradient_checkpointing", False)) and (
        torch.is_grad_enabled()
    )
    for layer in inner.layers:
        # a sharded layer's weights are gathered around its own forward method
        call = getattr(layer, "replayrl_run", None)
        step = run_layer if call is None else functools.partial(call, run_layer)
        if checkpointed:
            hp, hc = torch.utils.checkpoint.checkpoint(step, layer, hp, hc, use_reentrant=False)
        else:
            hp, hc = step(layer, hp, hc)
    if lay.segments is not None:
        return inner.norm(hp[0, lay.out_index])
    if not lay.shared:
        return inner.norm(hp[:, -lay.out_sel.shape[1] :])[lay.out_sel]
    last = inner.norm(hp[:, -1])[lay.group][:, None]
    states = last if hc is None else torch.cat([last, inner.norm(hc)], 1)
    return states[lay.out_sel]
