"""Per-token log-probs (and entropies) of completion tokens, computed from hidden states.

A causal LM's forward materialises logits for every position: batch x length x vocab floats
(16 x 300 x 49,152 = 943 MB in fp32 for SmolLM2), most of them prompt or padding positions
whose log-probs are never used. Here the backbone runs once, the output head is applied
only at the completion positions of `batch.mask`, in chunks, and the log-softmax is taken
in fp32 per chunk. Same values and gradients as the full computation (tests/test_logprobs.py);
measured 1.2-1.5x faster learner steps on SmolLM2-135M (BENCHMARKS.md).

Llama-architecture policies take the lean training forward (lean_forward.py: shared
prompts run once, frozen weights cast once under autocast) where it reproduces
transformers' forward (checked once per model); the head's log-softmax runs in one exp pass
with its own backward when no entropy gradient is asked for.

Backward keeps no logits: each head chunk runs under `torch.utils.checkpoint`, so what
a step keeps for the head is the completion states (tokens x hidden) plus one chunk's fp32
logits and softmax while that chunk is recomputed in backward (the fused linear-cross-entropy
idea), whatever the number of rows. Same values and gradients, one more head matmul per chunk.

The head-only path needs logits = output_embeddings(last_hidden_state), soft-capped where
the config says so (Gemma 2/3's `final_logit_softcapping`): checked once per model on a short
input; a model that fails the check (another transform of its logits) takes the full path,
with a warning that names it. A frozen-policy wrapper (learner/frozen.py: LoRA's disabled adapters,
an adapter snapshot) lends its policy module through `run_with`, so it takes the same path;
any other object that is not a module takes the full path.

Sharded policies (FSDP2, run/distributed/fsdp.py) take the same paths: the whole computation runs
as a forward method of the root shard group (its weights gathered around it), and the checks
above run once on the whole model before it is sharded (`prepare`); a sharded model never
checked takes the full path (`model(...)`, which FSDP's hooks cover).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import cast

import torch
import torch.utils.checkpoint

from replayrl.learner import lean_forward
from replayrl.learner.batching import TokenRows
from replayrl.models import precision
from replayrl.models.loading import unwrap_model

# rows of the flattened completion positions per head chunk: ~128 MB of fp32 logits
_CHUNK_ELEMENTS = 1 << 25
_CHECKED: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
_LEAN_CHECKED: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
_reference = False
_lean = True


@contextlib.contextmanager
def reference_impl(enabled: bool = True) -> Iterator[None]:
    """Use the full-logits computation (the reference the chunked one is tested against)
    inside this block: for benchmarks."""
    global _reference
    saved, _reference = _reference, enabled
    try:
        yield
    finally:
        _reference = saved


@contextlib.contextmanager
def lean_impl(enabled: bool = True) -> Iterator[None]:
    """Use (or, with False, skip) the lean Llama training forward (lean_forward.py) inside
    this block: for benchmarks and tests; on by default."""
    global _lean
    saved, _lean = _lean, enabled
    try:
        yield
    finally:
        _lean = saved


def token_logprobs_full(
    model, batch: TokenRows, temperature: float, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature and entropy, from full logits
    (every position, laid out like `mask`: (batch, length - 1))."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, 1:]
    token_logps = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logps.exp() * logps).sum(-1)
    return token_logps, entropy


def _split(model: object) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, output head) of a causal LM whose logits are head(last_hidden_state)."""
    if not isinstance(model, torch.nn.Module):
        return None
    core = unwrap_model(model)
    get_decoder = getattr(core, "get_decoder", None)
    get_head = getattr(core, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    try:
        backbone, head = get_decoder(), get_head()
    except (AttributeError, ValueError, NotImplementedError):
        return None
    if backbone is None or head is None or backbone is core:
        return None
    cap = getattr(getattr(core, "config", None), "final_logit_softcapping", None)
    if cap:  # Gemma 2/3: logits = cap * tanh(head(h) / cap)
        head = SoftCappedHead(head, float(cap))
    ok = _CHECKED.get(core)
    if ok is None:
        if _is_sharded(core):  # checked only whole (`prepare`): sharded, take the full path
            return None
        ok = _CHECKED[core] = _same_logits(core, backbone, head)
        if not ok:
            warnings.warn(
                f"{type(core).__name__}: its logits are not its output head applied to its "
                "final hidden states (a head this library does not reproduce), so its "
                "log-probs come from full logits: memory grows with rows x tokens x "
                "vocabulary",
                stacklevel=3,
            )
    return (backbone, head) if ok else None


class SoftCappedHead(torch.nn.Module):
    """An output head with logit soft-capping (Gemma 2/3's `final_logit_softcapping`):
    cap * tanh(head(h) / cap), applied per chunk like the plain head."""

    def __init__(self, head: torch.nn.Module, cap: float) -> None:
        super().__init__()
        self.head, self.cap = head, cap

    @property
    def weight(self) -> torch.Tensor:  # the vocabulary size is read from it
        return cast(torch.Tensor, self.head.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(h) / self.cap) * self.cap


def _is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule  # lazy: torch.distributed

    return isinstance(module, FSDPModule) or any(
        isinstance(m, FSDPModule) for m in module.modules()
    )


def prepare(model: object) -> None:
    """Decide, on the whole model, which path `token_logprobs` takes for it (the chunked head,
    the lean forward): what sharding (run/distributed/fsdp.py) needs before it splits the
    weights. The same checks `token_logprobs` would make at its first call."""
    if _split(model) is not None:
        _lean_core(model)


def _sharded_root(model: object) -> torch.nn.Module | None:
    """The root shard group of a sharded model (the module FSDP's root hooks sit on, with the
    `replayrl_run` forward method run/distributed/fsdp.py gives it), else None."""
    if isinstance(model, torch.nn.Module) and callable(getattr(model, "replayrl_run", None)):
        return model
    return None


def _rows_of(head: torch.nn.Module, default: int) -> int:
    """The output size (vocabulary) of an LM head's weight; `default` for a head without one."""
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else default


@torch.no_grad()
def _same_logits(core: torch.nn.Module, backbone: torch.nn.Module, head: torch.nn.Module) -> bool:
    """head(backbone(x)) reproduces the model's own logits on a short input."""
    vocab = _rows_of(head, default=2)
    device = next(core.parameters()).device
    ids = torch.arange(1, 9, device=device).remainder(vocab).unsqueeze(0)
    attn = torch.ones_like(ids)
    was_training = core.training
    core.eval()
    try:
        full = core(input_ids=ids, attention_mask=attn).logits.float()
        hidden = backbone(input_ids=ids, attention_mask=attn).last_hidden_state
        mine = head(hidden).float()
    except (TypeError, AttributeError, ValueError):
        return False
    finally:
        core.train(was_training)
    return mine.shape == full.shape and torch.allclose(mine, full, rtol=1e-4, atol=1e-4)


def _lean_core(model: object) -> torch.nn.Module | None:
    """The Llama inside `model` when the lean forward applies and reproduces transformers'
    forward on a short input (checked once per model), else None."""
    core = lean_forward.lean_core(model)
    if core is None or _split(model) is None:  # _split: logits are head(final states)
        return None
    ok = _LEAN_CHECKED.get(core)
    if ok is None:
        if _is_sharded(core):  # checked only whole (`prepare`)
            return None
        ok = _LEAN_CHECKED[core] = _lean_matches(core)
    return core if ok else None


@torch.no_grad()
def _lean_matches(core: torch.nn.Module) -> bool:
    """lean_forward.completion_states equals the backbone's own states at the completion
    positions of a small batch (two rows sharing a prompt, one not), in fp32."""
    vocab = _rows_of(cast(torch.nn.Module, core.lm_head), default=2)
    device = next(core.parameters()).device
    ids = torch.tensor(
        [[3, 5, 7, 9, 11, 2, 4, 0], [3, 5, 7, 9, 8, 6, 0, 0], [4, 6, 8, 10, 12, 14, 16, 18]],
        device=device,
    ).remainder(vocab)
    attn = torch.tensor([[1] * 7 + [0], [1] * 6 + [0] * 2, [1] * 8], device=device)
    mask = torch.zeros((3, 7), device=device)
    mask[0, 3:6] = 1  # prompt 3, 5, 7, 9 then 3 completion tokens
    mask[1, 3:5] = 1  # the same prompt, 2 completion tokens
    mask[2, 1:7] = 1  # prompt of 2 tokens, 6 completion tokens
    batch = TokenRows(ids, attn, mask)
    was_training = core.training
    core.eval()
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            backbone = cast(torch.nn.Module, core.model)
            hidden = backbone(input_ids=ids, attention_mask=attn).last_hidden_state
            ref = hidden[:, :-1][mask.bool()].float()
            # both layouts: shared prompts run once, and every row whole
            mine = [lean_forward.completion_states(core, batch, s).float() for s in (True, False)]
    except (TypeError, AttributeError, ValueError, RuntimeError):
        return False
    finally:
        core.train(was_training)
    # a structural check (a wrong mask or rotary moves states by O(1)); fp32 rounding moves
    # SmolLM2's states (up to ~50) by ~1e-3 through a different prompt batching
    tol = 1e-4 * max(1.0, float(ref.abs().max()))
    return all(m.shape == ref.shape and float((m - ref).abs().max()) <= tol for m in mine)


def _chunk_rows(vocab: int) -> int:
    return max(16, _CHUNK_ELEMENTS // max(vocab, 1))


def token_logprobs(
    model,
    batch: TokenRows,
    temperature: float,
    entropy_grad: bool = False,
    autocast: torch.dtype | None = None,
    full: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature and the per-token entropy, laid out
    like `batch.mask` ((batch, length - 1); zero outside the mask).

    `full` computes them from full-vocabulary logits at every position (`token_logprobs_full`,
    the older implementation: same values up to rounding, more memory).

    `autocast` (e.g. torch.bfloat16) runs the model's matmuls in that dtype (fp32 master
    weights untouched); the log-softmax is always fp32.
    """
    run_with = getattr(model, "run_with", None)
    if not isinstance(model, torch.nn.Module) and callable(run_with) and not (_reference or full):
        # a frozen policy: its module, as that policy (eval mode, adapters off or swapped)
        return run_with(
            lambda m: token_logprobs(m, batch, temperature, entropy_grad, autocast, full)
        )
    root = _sharded_root(model) if not (_reference or full) else None
    if root is not None:
        # sharded: the root group's weights (embeddings, final norm, head) gathered around
        # the whole computation; each decoder layer gathers its own (lean_forward.py)
        with lean_forward.sharded():
            run = cast(Callable[..., object], root.replayrl_run)
            out = run(
                lambda: _token_logprobs(model, batch, temperature, entropy_grad, autocast, full)
            )
        return cast(tuple[torch.Tensor, torch.Tensor], out)
    return _token_logprobs(model, batch, temperature, entropy_grad, autocast, full)


def _token_logprobs(
    model,
    batch: TokenRows,
    temperature: float,
    entropy_grad: bool,
    autocast: torch.dtype | None,
    full: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    with precision.autocast(autocast, batch.input_ids.device):
        if _reference or full:
            return token_logprobs_full(model, batch, temperature, entropy_grad)
        sel = batch.mask.bool()
        core = _lean_core(model) if _lean and bool(sel.any()) else None
        if core is not None and not lean_forward.fits(core, batch):
            core = None  # rows longer than the sliding window: the model's own attention
        if core is not None:
            # prompts run once per distinct prompt; frozen weights cast once (lean_forward)
            h = lean_forward.completion_states(core, batch)
            head = cast(torch.nn.Module, core.lm_head)
            return head_logprobs(h, head, batch, sel, temperature, entropy_grad, lean=True)
        parts = _split(model)
        if parts is None:
            return token_logprobs_full(model, batch, temperature, entropy_grad)
        backbone, head = parts
        ids, attn = batch.input_ids, batch.attention_mask
        hidden = backbone(input_ids=ids, attention_mask=attn).last_hidden_state
        # (N, hidden): the states that predict completion tokens
        return head_logprobs(hidden[:, :-1][sel], head, batch, sel, temperature, entropy_grad)


class _TargetLogProb(torch.autograd.Function):
    """log softmax(z)[target] and the entropy of softmax(z) (not differentiated) from one
    exp pass over the vocabulary; backward of the log-prob: g * (onehot(target) - softmax(z)).

    Same values as logsumexp / gather / softmax (tests/test_logprobs.py) with fewer passes
    over the (rows, vocabulary) fp32 logits, the largest tensors of a learner step.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, targets: torch.Tensor):
        m = z.amax(-1, keepdim=True)
        p = torch.sub(z, m).exp_()
        total = p.sum(-1, keepdim=True)
        lse = (m + total.log()).squeeze(-1)
        logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
        p.div_(total)  # softmax(z)
        ent = lse - torch.linalg.vecdot(p, z)  # H = lse - sum p z
        ctx.save_for_backward(p, targets)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp: torch.Tensor, g_ent: torch.Tensor):
        p, targets = ctx.saved_tensors
        grad = p.mul_(-g_logp[:, None])  # p is not needed again (once differentiable)
        grad.scatter_add_(-1, targets[:, None], g_logp[:, None])
        return grad, None


def head_logprobs(
    h: torch.Tensor,
    head: torch.nn.Module,
    batch: TokenRows,
    sel: torch.Tensor,
    temperature: float,
    entropy_grad: bool,
    lean: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of the completion tokens from their predicting states `h`,
    the head applied in chunks (fp32 log-softmax), scattered back to `sel`'s layout."""
    ids = batch.input_ids
    targets = ids[:, 1:][sel]
    dtype = lean_forward.autocast_dtype(ids.device) if lean else None
    want_entropy_grad = entropy_grad and torch.is_grad_enabled()
    differentiable = torch.is_grad_enabled() and (
        h.requires_grad or any(p.requires_grad for p in head.parameters())
    )

    def chunk(part: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = (lean_forward.linear(head, part, dtype) if lean else head(part)).float()
        if temperature != 1.0:
            z = z / temperature
        if not want_entropy_grad:  # one exp pass for both, and a lean backward
            return _TargetLogProb.apply(z, tgt)
        lse = torch.logsumexp(z, dim=-1)
        logp = z.gather(-1, tgt[:, None]).squeeze(-1) - lse
        # H = -sum p log p = lse - sum p z
        return logp, lse - (torch.softmax(z, dim=-1) * z).sum(-1)

    logp_parts, ent_parts = [], []
    rows = _chunk_rows(_rows_of(head, default=1))
    for start in range(0, h.shape[0], rows):
        part, tgt = h[start : start + rows], targets[start : start + rows]
        if differentiable:  # keep part and the outputs; backward recomputes the logits
            logp, ent = torch.utils.checkpoint.checkpoint(
                chunk, part, tgt, use_reentrant=False, preserve_rng_state=False
            )
        else:
            logp, ent = chunk(part, tgt)
        logp_parts.append(logp)
        ent_parts.append(ent)
    shape = sel.shape
    flat_lp = torch.cat(logp_parts) if logp_parts else h.new_zeros(0, dtype=torch.float32)
    flat_ent = torch.cat(ent_parts) if ent_parts else flat_lp.detach()
    zeros = torch.zeros(shape, dtype=torch.float32, device=ids.device)
    return zeros.masked_scatter(sel, flat_lp), zeros.masked_scatter(sel, flat_ent)
