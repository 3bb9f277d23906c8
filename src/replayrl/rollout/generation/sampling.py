"""Next-token sampling from one step's logits, returning the behaviour log-prob of each token.

Inverse-CDF sampling (cumulative sum + one uniform per row + binary search) draws from the
same distribution as `torch.multinomial` at a fraction of its cost on CPU (measured here:
0.3 ms vs 12 ms per step at batch 16, 49,152-token vocabulary).
"""

from __future__ import annotations

import torch


def _inverse_cdf(
    probs: torch.Tensor, generator: torch.Generator | None, last: torch.Tensor | None = None
) -> torch.Tensor:
    """One index per row drawn with P(i) = probs[i] / sum(probs) (probs >= 0, unnormalised).

    Index i is chosen when cdf[i-1] <= u < cdf[i] with u uniform on [0, cdf[-1]); a zero
    entry has cdf[i] == cdf[i-1] and so can never be chosen. `last` (rows, 1): the highest
    index each row may return (top-p: the nucleus's last token), a bound that holds whatever
    the cumulative sum's rounding; without it, the vocabulary's last index (a NaN row, from
    damaged weights, then still yields a valid token and the learner's non-finite check
    ends the run with its own message).
    """
    cdf = probs.cumsum(1)  # rows x vocabulary: dim 1 (written positive: -1 == 1 here)
    total = cdf[:, -1:]
    u = (
        torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype, generator=generator)
        * total
    )
    # u < total always, but fp rounding of the product can land on it: keep it below, so the
    # first cdf entry above u is always one that a non-zero probability raised (a clamp of
    # the index alone could pick a trailing zero, e.g. a token outside the top-p nucleus)
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, u, right=True)
    bound = last if last is not None else torch.full_like(idx, probs.shape[1] - 1)
    return torch.minimum(idx, bound).squeeze(1)


def top_p_keep(probs_sorted: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus mask over probabilities sorted in descending order: keep the smallest prefix
    whose mass reaches `top_p` (a token is kept when the mass strictly before it is below
    top_p; the most likely token always is), as transformers' TopPLogitsWarper does."""
    before = probs_sorted.cumsum(-1) - probs_sorted
    keep = before < top_p
    keep[..., 0] = True
    return keep


def sampling_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """The unnormalised probabilities (rows, vocab) a token is drawn from, in transformers'
    order (which TRL samples with): the repetition penalty on the raw logits of the tokens
    `seen` (rows, vocab bool: the prompt's and the completion's so far; a logit is divided by
    the penalty when positive, multiplied when negative), then temperature, top-k (ties at the
    k-th logit kept), top-p, min-p (tokens below min_p x the most likely one's probability
    dropped). Dropped tokens have probability 0."""
    x = logits.float()
    if repetition_penalty != 1.0 and seen is not None:
        penalised = torch.where(x < 0, x * repetition_penalty, x / repetition_penalty)
        x = torch.where(seen, penalised, x)
    if temperature != 1.0:
        x = x / temperature
    if 0 < top_k < x.shape[1]:
        kth = x.topk(top_k, dim=1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=1)
    if top_p < 1.0:
        probs_sorted, order = probs.sort(1, descending=True)
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep.scatter_(1, order, top_p_keep(probs_sorted, top_p))
        probs = probs * keep
    if min_p > 0.0:  # relative to the most likely token, which is always kept
        probs = probs * (probs >= min_p * probs.max(1, keepdim=True).values)
    return probs


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    *,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` (rows, vocab: always 2-D, so dims are written
    as 1, not -1); return (tokens, log-probs).

    The token is drawn from softmax(logits / temperature) restricted to the top-p nucleus
    (renormalised), and with `top_k`, `min_p` or a repetition penalty (over the tokens
    `seen`) from `sampling_probs`; greedy takes the argmax. The returned log-prob is always
    that of the untruncated tempered policy, log softmax(logits / T)[token] (T = 1 when
    greedy): the quantity the learner recomputes (see generation/hf.py), as TRL's
    old_per_token_logps are.
    """
    logits = logits.float()
    # x / 1.0 == x exactly: skip a full-vocabulary pass per step at the default temperature
    scaled = logits if greedy or temperature == 1.0 else logits / temperature
    logp = torch.log_softmax(scaled, dim=1)
    penalty = repetition_penalty != 1.0 and seen is not None
    if greedy:
        tokens = scaled.argmax(1)
    elif top_k or min_p or penalty:
        probs = sampling_probs(logits, temperature, top_p, top_k, min_p, repetition_penalty, seen)
        tokens = _inverse_cdf(probs, generator)
    elif top_p < 1.0:
        probs_sorted, order = logp.exp().sort(1, descending=True)
        keep = top_p_keep(probs_sorted, top_p)
        probs_sorted = probs_sorted * keep
        # the nucleus is a prefix of the sorted vocabulary: its last index bounds the draw
        nucleus_last = keep.sum(1, keepdim=True) - 1
        tokens = order.gather(1, _inverse_cdf(probs_sorted, generator, nucleus_last).unsqueeze(1))
        tokens = tokens.squeeze(1)
    else:
        tokens = _inverse_cdf(logp.exp(), generator)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
