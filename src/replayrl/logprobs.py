"""Per-token log-probs (and entropies) of completion tokens, computed from hidden states.

A causal LM's forward materialises logits for every position: batch x length x vocab floats
(16 x 300 x 49,152 = 943 MB in fp32 for SmolLM2), most of them prompt or padding positions
whose log-probs are never used. Here the backbone runs once, the output head is applied
only at the completion positions of `batch["mask"]`, in chunks, and the log-softmax is taken
in fp32 per chunk. Same values and gradients as the full computation (tests/test_logprobs.py);
measured 1.2-1.5x faster learner steps on SmolLM2-135M (BENCHMARKS.md).

The head-only path needs logits = output_embeddings(last_hidden_state): checked once per
model on a short input (a model with logit soft-capping or scaling fails the check and
takes the full path), and anything that is not a module (a frozen-policy wrapper) takes the
full path too.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch

from replayrl import precision
from replayrl.models import unwrap_model

# rows of the flattened completion positions per head chunk: ~128 MB of fp32 logits
_CHUNK_ELEMENTS = 1 << 25
_CHECKED: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
_reference = False


@contextlib.contextmanager
def reference_impl(enabled: bool = True) -> Iterator[None]:
    """Use the full-logits computation (the old path) inside this block: for benchmarks."""
    global _reference
    saved, _reference = _reference, enabled
    try:
        yield
    finally:
        _reference = saved


def token_logprobs_full(
    model, batch: dict[str, torch.Tensor], temperature: float, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature and entropy, from full logits
    (every position, laid out like `mask`: (batch, length - 1))."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    targets = batch["input_ids"][:, 1:]
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
    ok = _CHECKED.get(core)
    if ok is None:
        ok = _CHECKED[core] = _same_logits(core, backbone, head)
    return (backbone, head) if ok else None


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


def _chunk_rows(vocab: int) -> int:
    return max(16, _CHUNK_ELEMENTS // max(vocab, 1))


def token_logprobs(
    model,
    batch: dict[str, torch.Tensor],
    temperature: float,
    entropy_grad: bool = False,
    autocast: torch.dtype | None = None,
    full: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature and the per-token entropy, laid out
    like `batch["mask"]` ((batch, length - 1); zero outside the mask).

    `full` computes them from full-vocabulary logits at every position (`token_logprobs_full`,
    the older implementation: same values up to rounding, more memory).

    `autocast` (e.g. torch.bfloat16) runs the model's matmuls in that dtype (fp32 master
    weights untouched); the log-softmax is always fp32.
    """
    with precision.autocast(autocast, batch["input_ids"].device):
        parts = None if _reference or full else _split(model)
        if parts is None:
            return token_logprobs_full(model, batch, temperature, entropy_grad)
        return _token_logprobs_head(parts, batch, temperature, entropy_grad)


def _token_logprobs_head(
    parts: tuple[torch.nn.Module, torch.nn.Module],
    batch: dict[str, torch.Tensor],
    temperature: float,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    backbone, head = parts
    ids = batch["input_ids"]
    mask = batch["mask"] if "mask" in batch else batch["attention_mask"][:, 1:]
    sel = mask.bool()
    hidden = backbone(input_ids=ids, attention_mask=batch["attention_mask"]).last_hidden_state
    h = hidden[:, :-1][sel]  # (N, hidden): the states that predict completion tokens
    targets = ids[:, 1:][sel]
    want_entropy_grad = entropy_grad and torch.is_grad_enabled()
    logp_parts, ent_parts = [], []
    rows = _chunk_rows(_rows_of(head, default=1))
    for start in range(0, h.shape[0], rows):
        z = head(h[start : start + rows]).float() / temperature
        lse = torch.logsumexp(z, dim=-1)
        logp_parts.append(z.gather(-1, targets[start : start + rows, None]).squeeze(-1) - lse)
        with torch.set_grad_enabled(want_entropy_grad):
            zz, ll = (z, lse) if want_entropy_grad else (z.detach(), lse.detach())
            # H = -sum p log p = lse - sum p z
            ent_parts.append(ll - (torch.softmax(zz, dim=-1) * zz).sum(-1))
    shape = sel.shape
    flat_lp = torch.cat(logp_parts) if logp_parts else hidden.new_zeros(0, dtype=torch.float32)
    flat_ent = torch.cat(ent_parts) if ent_parts else flat_lp.detach()
    zeros = torch.zeros(shape, dtype=torch.float32, device=ids.device)
    return zeros.masked_scatter(sel, flat_lp), zeros.masked_scatter(sel, flat_ent)


def refresh_behaviour_logprobs(
    rollouts: Sequence,
    version: int,
    recompute: Callable[[list], list[torch.Tensor]],
    band: float = 0.2,
) -> dict[str, float]:
    """Replace the sampler's log-probs of fresh rollouts with the learner's own; return the
    mismatch between the two.

    With reduced precision on either side (bf16 generation or learner autocast) the two
    computations of log pi_old differ by ~0.02 per token on average, so the PPO/GRPO ratio
    pi_theta / pi_old is not 1 on fresh data before any update, and clipping acts on
    numerical noise. Rollouts generated by the learner's current weights
    (`policy_version == version`) get log pi_old recomputed by the learner (`recompute`:
    rollouts -> per-token log-probs, no grad), so their ratio starts at exactly 1, as on-policy
    PPO assumes (verl's recomputed old_log_prob). Their sampler values move to
    `extras["sampler_logprobs"]`; each rollout is refreshed once, so a replayed rollout keeps
    the learner-precision log-probs of the policy that generated it. Stale rollouts (older
    weights) cannot be recomputed and keep the sampler's values (counted).
    Returns mean / max |diff| over refreshed tokens, the share of tokens with
    exp(diff) outside [1 - band, 1 + band], and counts.
    """
    fresh = [
        r for r in rollouts if r.policy_version == version and "sampler_logprobs" not in r.extras
    ]
    stale = sum(
        1 for r in rollouts if r.policy_version != version and "sampler_logprobs" not in r.extras
    )
    out = {"behaviour_refreshed": float(len(fresh)), "behaviour_not_refreshed": float(stale)}
    if not fresh:
        return out
    new = recompute(fresh)
    diffs = []
    for r, lp in zip(fresh, new, strict=True):
        lp = lp.detach().to(torch.float32).cpu()
        if lp.shape != r.behaviour_logprobs.shape:
            raise ValueError(
                f"recomputed log-probs have shape {tuple(lp.shape)}, the rollout's "
                f"{tuple(r.behaviour_logprobs.shape)}"
            )
        diffs.append(lp - r.behaviour_logprobs)
        r.extras["sampler_logprobs"] = r.behaviour_logprobs
        r.behaviour_logprobs = lp
    d = torch.cat(diffs).abs()
    outside = (d.exp() > 1 + band) | ((-d).exp() < 1 - band)
    out.update(
        behaviour_mismatch_mean=float(d.mean()) if d.numel() else 0.0,
        behaviour_mismatch_max=float(d.max()) if d.numel() else 0.0,
        behaviour_ratio_outside=float(outside.float().mean()) if d.numel() else 0.0,
    )
    return out
