"""Learner memory: the head keeps no logits for backward (each chunk is recomputed), frozen
LoRA policies take the chunked path, gradient checkpointing applies to the lean forward, the
lean forward can be switched off, and lean attention calls SDPA in forms the fused kernels
accept. Values and gradients stay those of the full-logits computation."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias
from transformers import LlamaConfig, LlamaForCausalLM

from replayrl.config.schema import LoraConfig, ModelConfig
from replayrl.data.rollout_record import Rollout
from replayrl.learner import lean_forward
from replayrl.learner import logprobs as lp_mod
from replayrl.learner.batching import collate
from replayrl.learner.frozen import AdaptersDisabled, AdapterSnapshot
from replayrl.learner.logprobs import reference_impl, token_logprobs
from replayrl.models.loading import apply_lora, prepare_policy

VOCAB = 300


def _llama(layers: int = 2) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        pad_token_id=0,
    )
    torch.manual_seed(5)
    return LlamaForCausalLM(cfg)


def _batch(prompts: list[int], completions: list[int]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids = torch.randint(3, VOCAB, (p + c,), generator=g)
        rows.append(
            Rollout(
                prompt_ids=ids[:p],
                completion_ids=ids[p:],
                behaviour_logprobs=torch.zeros(c),
                reward=0.0,
                advantage=1.0,
                correct=False,
                group_id=i,
                policy_version=0,
                step=0,
            )
        )
    return collate(rows, 0)


@contextlib.contextmanager
def _saved_bytes(out: dict[str, int], vocab: int | None = None):
    """Sum the bytes autograd saves for backward (only tensors whose last dim is `vocab`,
    when given: logit-shaped ones)."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        if vocab is None or (t.dim() >= 2 and t.shape[-1] == vocab):
            out["bytes"] = out.get("bytes", 0) + t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _loss_grads(model, batch, entropy_grad: bool, full: bool):
    model.zero_grad(set_to_none=True)
    with reference_impl(full):
        logps, ent = token_logprobs(model, batch, 0.8, entropy_grad=entropy_grad)
    m = batch.mask
    (-(logps * m).sum() - 0.1 * (ent * m).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), ent.detach(), grads


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_head_keeps_no_logits_for_backward_and_gradients_are_unchanged(entropy_grad, monkeypatch):
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 16 * VOCAB)  # 16-row chunks: several
    model = _llama()
    batch = _batch([4, 7, 3, 5], [20, 9, 14, 12])
    counted: dict[str, int] = {}
    with _saved_bytes(counted, vocab=VOCAB):
        token_logprobs(model, batch, 0.8, entropy_grad=entropy_grad)
    # before: every chunk's fp32 softmax (tokens x vocab) was kept for backward
    assert counted.get("bytes", 0) == 0
    lp, ent, g = _loss_grads(model, batch, entropy_grad, full=False)
    lp_ref, ent_ref, g_ref = _loss_grads(model, batch, entropy_grad, full=True)
    m = batch.mask.bool()
    assert float((lp - lp_ref)[m].abs().max()) < 1e-5
    assert float((ent - ent_ref)[m].abs().max()) < 1e-5
    assert g.keys() == g_ref.keys() and g
    for name, ref in g_ref.items():  # fp32 rounding of a different summation order
        scale = max(1.0, float(ref.abs().max()))
        assert float((g[name] - ref).abs().max()) < 1e-4 * scale, name


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft")
def test_frozen_lora_policies_take_the_chunked_path(monkeypatch):
    cfg = ModelConfig(lora=LoraConfig(enabled=True, r=4, target_modules=["q_proj", "v_proj"]))
    model = apply_lora(_llama(), cfg, seed=0)
    batch = _batch([4, 6], [8, 5])
    snap = AdapterSnapshot(model)
    with torch.no_grad():  # move the adapters on: the snapshot keeps the old ones
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.3)
    frozen = {"disabled": AdaptersDisabled(model), "snapshot": snap}
    with torch.no_grad(), reference_impl():
        want = {k: token_logprobs(f, batch, 1.0)[0] for k, f in frozen.items()}
        policy = token_logprobs(model, batch, 1.0)[0]

    def no_full(*args, **kwargs):
        raise AssertionError("full-logits path taken")

    monkeypatch.setattr(lp_mod, "token_logprobs_full", no_full)
    m = batch.mask.bool()
    for key, f in frozen.items():
        with torch.no_grad():
            got, _ = token_logprobs(f, batch, 1.0)
        assert float((got - want[key])[m].abs().max()) < 1e-5, key
        assert float((got - policy)[m].abs().max()) > 1e-3, key  # not the live adapters
    assert model.training  # the wrappers restore the policy's mode


def _lean_run(model, batch):
    model.zero_grad(set_to_none=True)
    counted: dict[str, int] = {}
    with _saved_bytes(counted):
        states = lean_forward.completion_states(model, batch)
    states.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return counted["bytes"], states.detach(), grads


def test_gradient_checkpointing_reaches_the_lean_forward():
    model = _llama(layers=3)
    model.train()
    batch = _batch([5, 8, 6, 5], [30, 24, 28, 16])
    plain_bytes, plain_states, plain_grads = _lean_run(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt_bytes, ckpt_states, ckpt_grads = _lean_run(model, batch)
    assert ckpt_bytes < 0.25 * plain_bytes, (ckpt_bytes, plain_bytes)
    assert torch.equal(ckpt_states, plain_states)
    assert ckpt_grads.keys() == plain_grads.keys() and ckpt_grads
    for name, g in plain_grads.items():
        assert torch.allclose(ckpt_grads[name], g, rtol=1e-5, atol=1e-7), name


def test_lean_forward_can_be_switched_off(char_tokenizer, monkeypatch):
    model, _ = prepare_policy(_llama(), char_tokenizer, ModelConfig(lean_forward=False))
    assert lean_forward.lean_core(model) is None
    on, _ = prepare_policy(_llama(), char_tokenizer, ModelConfig())
    assert lean_forward.lean_core(on) is on

    def no_lean(*args, **kwargs):
        raise AssertionError("lean forward taken")

    monkeypatch.setattr(lean_forward, "completion_states", no_lean)
    batch = _batch([4, 6], [8, 5])
    logps, _ = token_logprobs(model, batch, 1.0)
    with reference_impl():
        ref, _ = token_logprobs(model, batch, 1.0)
    m = batch.mask.bool()
    assert torch.allclose(logps[m], ref[m], atol=1e-5)


def _sdpa_calls(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    real = F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, **kwargs):
        calls.append({"q": q.shape, "k": k.shape, "mask": attn_mask, **kwargs})
        # CausalBias dispatches only when it sees the real function there
        monkeypatch.setattr(F, "scaled_dot_product_attention", real)
        try:
            return real(q, k, v, attn_mask, **kwargs)
        finally:
            monkeypatch.setattr(F, "scaled_dot_product_attention", record)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return calls


def _states_match_and_sdpa_calls(model, batch, shared: bool, monkeypatch) -> list[dict]:
    """Lean completion states equal transformers' own; returns the SDPA calls they made."""
    with torch.no_grad():
        ref = model.model(batch.input_ids, attention_mask=batch.attention_mask)
        want = ref.last_hidden_state[:, :-1][batch.mask.bool()]
        calls = _sdpa_calls(monkeypatch)
        got = lean_forward.completion_states(model, batch, share=shared)
    assert torch.allclose(got, want, atol=1e-5)
    assert calls
    return calls


@pytest.mark.parametrize("shared", [True, False])
def test_lean_attention_is_mask_free_without_padding(shared, monkeypatch):
    model = _llama()
    model.eval()
    # shared: one prompt length, completions of any length (right padding is never attended
    # by a real token); rows whole: one row length
    batch = _batch([6, 6, 6], [9, 4, 7] if shared else [7, 7, 7])
    if shared:  # three completions of one prompt
        batch.input_ids[1:, :6] = batch.input_ids[0, :6]
    calls = _states_match_and_sdpa_calls(model, batch, shared, monkeypatch)
    for c in calls:  # causal from the start (prompts) or from the end (completions)
        top_left = c["mask"] is None and c.get("is_causal")
        assert top_left or isinstance(c["mask"], CausalBias), c
    assert any(c.get("is_causal") for c in calls)
    assert any(isinstance(c["mask"], CausalBias) for c in calls) == shared


@pytest.mark.parametrize("shared", [True, False])
def test_lean_attention_with_padding_expands_kv_heads(shared, monkeypatch):
    model = _llama()
    model.eval()
    batch = _batch([3, 7, 7, 5], [9, 4, 6, 8])
    if shared:
        batch.input_ids[2, :7] = batch.input_ids[1, :7]
    calls = _states_match_and_sdpa_calls(model, batch, shared, monkeypatch)
    for c in calls:
        assert type(c["mask"]) is torch.Tensor and c["mask"].dtype == torch.bool
        assert c["k"][1] == c["q"][1]  # K/V expanded to the query heads
        assert not c.get("enable_gqa", False)


def test_gqa_goes_to_a_fused_kernel_only_where_one_takes_it():
    takes = lean_forward.fused_gqa_kernel
    assert takes("cpu", torch.float32, (0, 0), 64)
    assert takes("cuda", torch.bfloat16, (9, 0), 64)  # an H100 / H200 in bf16
    assert takes("cuda", torch.float16, (8, 0), 128)
    assert not takes("cuda", torch.float32, (9, 0), 64)  # fp32: the math kernel
    assert not takes("cuda", torch.float16, (7, 5), 64)  # a T4: no FlashAttention
    assert not takes("cuda", torch.bfloat16, (9, 0), 36)  # head_dim not a multiple of 8
    assert not takes("cuda", torch.bfloat16, (9, 0), 512)
    assert lean_forward._kernel_takes_gqa(torch.zeros(1, 2, 3, 8))  # a CPU tensor


@pytest.mark.parametrize("shared", [True, False])
def test_causal_pass_expands_kv_heads_where_no_fused_kernel_takes_gqa(shared, monkeypatch):
    """fp32 on CUDA: the mask-free causal pass expands K/V and stays causal (the
    memory-efficient kernel's layout) instead of passing enable_gqa (the math kernel's)."""
    model = _llama()
    model.eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    monkeypatch.setattr(lean_forward, "_kernel_takes_gqa", lambda q: False)
    # no padding: the prompt pass is causal from the start; shared, completions after it
    batch = _batch([6, 6, 6], [9, 4, 7] if shared else [7, 7, 7])
    if shared:
        batch.input_ids[1:, :6] = batch.input_ids[0, :6]
    calls = _states_match_and_sdpa_calls(model, batch, shared, monkeypatch)
    for c in calls:
        top_left = c["mask"] is None and c.get("is_causal")
        assert top_left or isinstance(c["mask"], CausalBias), c
        assert c["k"][1] == c["q"][1]
        assert not c.get("enable_gqa", False)
    assert any(c.get("is_causal") for c in calls)
