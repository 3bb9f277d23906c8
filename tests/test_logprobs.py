"""The completion-only, chunked log-prob path equals the full-logits computation (values,
entropies and gradients), for a plain model, a LoRA model and non-module wrappers."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from replayrl.config.schema import ModelConfig
from replayrl.data.rollout_record import Rollout
from replayrl.learner import logprobs as lp_mod
from replayrl.learner.learner import AdaptersDisabled, collate
from replayrl.learner.logprobs import reference_impl, token_logprobs, token_logprobs_full
from replayrl.models.loading import apply_lora


def _rollout(prompt: list[int], completion: list[int]) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor(prompt),
        completion_ids=torch.tensor(completion),
        behaviour_logprobs=torch.zeros(len(completion)),
        reward=0.0,
        advantage=1.0,
        correct=False,
        group_id=0,
        policy_version=0,
        step=0,
    )


@pytest.fixture()
def batch(char_tokenizer) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    v = len(char_tokenizer)
    rows = []
    for p, c in [(3, 5), (9, 2), (1, 7), (6, 6)]:  # mixed prompt/completion lengths
        rows.append(
            _rollout(
                torch.randint(4, v, (p,), generator=g).tolist(),
                torch.randint(4, v, (c,), generator=g).tolist(),
            )
        )
    return collate(rows, char_tokenizer.pad_token_id)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _check_equal(model: torch.nn.Module, batch, temperature: float) -> None:
    mask = batch.mask
    results = []
    for fast in (True, False):
        model.zero_grad(set_to_none=True)
        with reference_impl(not fast):
            logps, ent = token_logprobs(model, batch, temperature, entropy_grad=True)
        loss = -(logps * mask).sum() - 0.1 * (ent * mask).sum()
        loss.backward()
        results.append((logps.detach(), ent.detach(), _grads(model)))
    (lp_fast, ent_fast, g_fast), (lp_full, ent_full, g_full) = results
    m = mask.bool()
    assert torch.allclose(lp_fast[m], lp_full[m], atol=1e-5)
    assert torch.allclose(ent_fast[m], ent_full[m], atol=1e-5)
    assert bool((lp_fast[~m] == 0).all()) and bool((ent_fast[~m] == 0).all())
    assert len(g_fast) == len(g_full) > 0
    for a, b in zip(g_fast, g_full, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_path_matches_full_logits(tiny_model, batch, temperature, monkeypatch):
    model = copy.deepcopy(tiny_model)
    # several chunks even on this tiny batch (the real chunk is ~128 MB of logits)
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 7 * len(model.lm_head.weight))
    assert lp_mod._split(model) is not None  # the fast path is taken
    _check_equal(model, batch, temperature)


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft not installed")
def test_chunked_path_with_lora_adapters(tiny_model, batch):
    cfg = ModelConfig.model_validate({"lora": {"enabled": True, "r": 4, "alpha": 8}})
    model = apply_lora(copy.deepcopy(tiny_model), cfg)
    with torch.no_grad():  # non-zero B so the adapters change the output
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    assert lp_mod._split(model) is not None
    _check_equal(model, batch, 1.0)
    # the adapters-disabled reference (not a module) takes the full path, with adapters off
    base = AdaptersDisabled(model)
    with torch.no_grad():
        got, _ = token_logprobs(base, batch, 1.0)
        want, _ = token_logprobs_full(tiny_model, batch, 1.0)
    m = batch.mask.bool()
    assert torch.allclose(got[m], want[m], atol=1e-5)


def test_model_whose_logits_are_not_the_head_takes_the_full_path(tiny_model, batch):
    model = copy.deepcopy(tiny_model)
    inner = model.forward

    def scaled_forward(*args, **kwargs):  # e.g. a logit scale or soft-capping
        out = inner(*args, **kwargs)
        out.logits = 0.5 * out.logits
        return out

    model.forward = scaled_forward
    assert lp_mod._split(model) is None
    with torch.no_grad():
        got, _ = token_logprobs(model, batch, 1.0)
        want, _ = token_logprobs_full(model, batch, 1.0)
    assert torch.equal(got, want)


def test_no_grad_entropy_unless_asked(tiny_model, batch):
    model = copy.deepcopy(tiny_model)
    logps, ent = token_logprobs(model, batch, 1.0)
    assert logps.requires_grad and not ent.requires_grad
    _, ent = token_logprobs(model, batch, 1.0, entropy_grad=True)
    assert ent.requires_grad


def test_full_flag_is_the_full_logits_computation(tiny_model, batch):
    """token_logprobs(full=True) (train.logprobs_impl=full) is token_logprobs_full exactly;
    the chunked default agrees with it up to rounding."""
    with torch.no_grad():
        full, full_ent = token_logprobs(tiny_model, batch, 0.7, full=True)
        ref, ref_ent = token_logprobs_full(tiny_model, batch, 0.7)
        chunked, _ = token_logprobs(tiny_model, batch, 0.7)
    m = batch.mask.bool()
    assert torch.equal(full, ref) and torch.equal(full_ent, ref_ent)
    assert torch.allclose(chunked[m], ref[m], atol=1e-5)


def test_learner_reads_logprobs_impl():
    from replayrl.config.schema import load_config
    from replayrl.learner.learner import Learner

    tiny = torch.nn.Linear(2, 2)  # only the optimizer sees it at construction
    for impl, full in (("chunked", False), ("full", True)):
        learner = Learner(tiny, 0, load_config(None, [f"train.logprobs_impl={impl}"]))  # type: ignore[arg-type]
        assert learner.full_logprobs is full


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_pass_log_softmax_matches_full_logits(tiny_model, batch, temperature, monkeypatch):
    """Without an entropy gradient the head's log-softmax is _TargetLogProb (one exp pass,
    its own backward): same log-probs, entropies and gradients as full logits."""
    model = copy.deepcopy(tiny_model)
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 7 * len(model.lm_head.weight))
    mask = batch.mask
    results = []
    for fast in (True, False):
        model.zero_grad(set_to_none=True)
        with reference_impl(not fast):
            logps, ent = token_logprobs(model, batch, temperature)
        assert not ent.requires_grad
        weights = torch.linspace(-1.0, 2.0, mask.numel()).view_as(mask)  # uneven dL/dlogp
        (logps * mask * weights).sum().backward()
        results.append((logps.detach(), ent, _grads(model)))
    (lp_fast, ent_fast, g_fast), (lp_full, ent_full, g_full) = results
    m = mask.bool()
    assert torch.allclose(lp_fast[m], lp_full[m], atol=1e-5)
    assert torch.allclose(ent_fast[m], ent_full[m], atol=1e-5)
    assert len(g_fast) == len(g_full) > 0
    for a, b in zip(g_fast, g_full, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
