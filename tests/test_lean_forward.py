"""The lean Llama training forward (lean_forward.py) against transformers' forward: the same
completion log-probs, entropies and gradients (full fine-tuning and LoRA), prompts shared by
several rows, bf16 autocast, adapters switched off, and the fallback when it does not match."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from replayrl.data.rollout_record import Rollout
from replayrl.learner import lean_forward
from replayrl.learner import logprobs as lp_mod
from replayrl.learner.batching import collate, shared_prompt_order
from replayrl.learner.logprobs import lean_impl, reference_impl, token_logprobs

VOCAB = 40


def _llama(tie: bool = False) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        tie_word_embeddings=tie,
        pad_token_id=0,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(cfg)


def _rollout(prompt: list[int], completion: list[int], group: int) -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor(prompt),
        completion_ids=torch.tensor(completion),
        behaviour_logprobs=torch.zeros(len(completion)),
        reward=0.0,
        advantage=1.0,
        correct=False,
        group_id=group,
        policy_version=0,
        step=0,
    )


def _rollouts() -> list[Rollout]:
    """Two prompts shared by 3 and 2 rows, one prompt alone; completions of 1 to 9 tokens."""
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    p1, p2, p3 = ids(6), ids(11), ids(2)
    return [
        _rollout(p1, ids(5), 0),
        _rollout(p2, ids(9), 1),
        _rollout(p1, ids(1), 0),
        _rollout(p3, ids(7), 2),
        _rollout(p2, ids(3), 1),
        _rollout(p1, ids(8), 0),
    ]


def _run(model, batch, lean: bool, temperature: float = 0.7, autocast=None):
    model.zero_grad(set_to_none=True)
    with lean_impl(lean):
        logps, ent = token_logprobs(model, batch, temperature, entropy_grad=True, autocast=autocast)
    loss = -(logps * batch.mask).sum() - 0.1 * (ent * batch.mask).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), ent.detach(), grads


def _compare(model, batch, atol: float = 1e-5, autocast=None) -> None:
    assert lp_mod._lean_core(model) is not None  # the lean path is taken
    lp_lean, ent_lean, g_lean = _run(model, batch, True, autocast=autocast)
    with reference_impl():  # transformers' forward, full-vocabulary logits
        lp_ref, ent_ref, g_ref = _run(model, batch, False, autocast=autocast)
    m = batch.mask.bool()
    assert float((lp_lean - lp_ref)[m].abs().max()) < atol
    assert float((ent_lean - ent_ref)[m].abs().max()) < atol
    assert bool((lp_lean[~m] == 0).all())
    assert g_lean.keys() == g_ref.keys() and len(g_lean) > 0
    for name, g in g_ref.items():
        scale = max(1.0, float(g.abs().max()))
        assert float((g_lean[name] - g).abs().max()) < atol * 10 * scale, name


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("share_min", [0.0, 2.0])  # shared prompts run once / rows whole
def test_full_finetuning_same_logprobs_and_gradients(tie, share_min, monkeypatch):
    monkeypatch.setattr(lean_forward, "_SHARE_MIN", share_min)
    model = _llama(tie).train()
    _compare(model, collate(_rollouts(), 0))


@pytest.mark.parametrize("share_min", [0.0, 2.0])
def test_rows_ordered_by_shared_prompt_and_all_completions_of_one_token(share_min, monkeypatch):
    monkeypatch.setattr(lean_forward, "_SHARE_MIN", share_min)
    model = _llama().train()
    rs = _rollouts()
    ordered = [rs[i] for i in shared_prompt_order(rs)]
    _compare(model, collate(ordered, 0))
    single = [_rollout([5, 6, 7], [9], 0), _rollout([5, 6, 7], [4], 0), _rollout([8], [3], 1)]
    _compare(model, collate(single, 0))  # no completion inputs at all: prompts only


@pytest.mark.parametrize("share_min", [0.0, 2.0])
def test_lora_same_logprobs_and_gradients_and_adapters_off(share_min, monkeypatch):
    monkeypatch.setattr(lean_forward, "_SHARE_MIN", share_min)
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # a trained adapter (B = 0 at init would change nothing)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.train()
    batch = collate(_rollouts(), 0)
    _compare(model, batch)
    # adapters switched off (the KL reference): the lean path must drop them too
    with model.disable_adapter(), torch.no_grad():
        off, _ = token_logprobs(model, batch, 1.0)
        with reference_impl():
            ref, _ = token_logprobs(model, batch, 1.0)
        with_adapters_ref, _ = token_logprobs(model.get_base_model(), batch, 1.0)
    m = batch.mask.bool()
    assert float((off - ref)[m].abs().max()) < 1e-5
    assert float((off - with_adapters_ref)[m].abs().max()) < 1e-5


def test_bf16_autocast_agrees_with_transformers_autocast_and_cache_follows_weights():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    model.train()
    batch = collate(_rollouts(), 0)
    m = batch.mask.bool()
    with lean_impl(True), torch.no_grad():
        a, _ = token_logprobs(model, batch, 1.0, autocast=torch.bfloat16)
    with reference_impl(), torch.no_grad():
        b, _ = token_logprobs(model, batch, 1.0, autocast=torch.bfloat16)
        fp32, _ = token_logprobs(model, batch, 1.0)
    # both are bf16 computations of the same thing: they differ by bf16 rounding noise,
    # about as much as transformers' bf16 differs from fp32
    noise = float((b - fp32)[m].abs().mean())
    assert 0 < float((a - b)[m].abs().mean()) < 2 * noise
    assert float((a - fp32)[m].abs().mean()) < 2 * noise
    # a frozen base weight changed in place: the cached bf16 copy must not be reused
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "base_layer" in name and "v_proj" in name:
                p.mul_(3.0)
    with lean_impl(True), torch.no_grad():
        a2, _ = token_logprobs(model, batch, 1.0, autocast=torch.bfloat16)
    with reference_impl(), torch.no_grad():
        b2, _ = token_logprobs(model, batch, 1.0, autocast=torch.bfloat16)
    assert float((a2 - a)[m].abs().mean()) > 10 * noise
    assert float((a2 - b2)[m].abs().mean()) < 2 * noise


def test_bf16_autocast_casts_each_frozen_projection_once():
    """Every frozen Linear the lean forward multiplies by (LoRA's base layers, the MLP's
    three projections, the other attention projections, the head) has its bf16 copy cached;
    LoRA projections run through the lean path, not peft's forward."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    model.train()
    with lean_impl(True), torch.no_grad():
        token_logprobs(model, collate(_rollouts(), 0), 1.0, autocast=torch.bfloat16)
    frozen = {
        n: m
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear and not m.weight.requires_grad
    }
    assert any("q_proj.base_layer" in n for n in frozen) and any("up_proj" in n for n in frozen)
    uncached = [n for n, m in frozen.items() if lean_forward._WEIGHTS.get(m) is None]
    assert uncached == []
    assert {lean_forward._WEIGHTS[m][1] for m in frozen.values()} == {torch.bfloat16}


def test_linear_calls_a_module_of_another_kind_as_it_is():
    class Doubled(torch.nn.Module):  # e.g. a quantised projection: no nn.Linear, no LoRA
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * self.inner(x)

    mod, x = Doubled(), torch.randn(5, 4)
    assert torch.equal(lean_forward.linear(mod, x, None), mod(x))


def test_a_lean_forward_that_disagrees_is_not_used(monkeypatch):
    """The per-model check catches a forward that does not reproduce transformers' (here:
    rotary embeddings left out), and the log-probs come from transformers' forward."""
    model = _llama().eval()
    monkeypatch.setattr(lean_forward, "apply_rotary_pos_emb", lambda q, k, cos, sin: (q, k))
    assert lp_mod._lean_core(model) is None
    batch = collate(_rollouts(), 0)
    with torch.no_grad():
        got, _ = token_logprobs(model, batch, 1.0)
        with reference_impl():
            want, _ = token_logprobs(model, batch, 1.0)
    m = batch.mask.bool()
    assert float((got - want)[m].abs().max()) < 1e-5


def test_shared_prompt_order_groups_prompts():
    rs = _rollouts()
    order = shared_prompt_order(rs)
    assert sorted(order) == list(range(len(rs)))
    prompts = [tuple(rs[i].prompt_ids.tolist()) for i in order]
    # each prompt's rows are consecutive, longest prompt first
    runs = [p for i, p in enumerate(prompts) if i == 0 or p != prompts[i - 1]]
    assert len(runs) == len(set(prompts)) == 3
    assert [len(p) for p in runs] == [11, 6, 2]


def _small(config_cls, model_cls, **extra):
    """A tiny model of another family (random weights): 2 layers, GQA, head_dim 8."""
    cfg = config_cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        initializer_range=0.3,
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(4)
    return model_cls(cfg)


def _families():
    from transformers import (
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    return {
        # q/k/v biases; Qwen2.5's tied head
        "qwen2": lambda: _small(Qwen2Config, Qwen2ForCausalLM, tie_word_embeddings=True),
        # per-head RMSNorm of q and k before the rotary embedding
        "qwen3": lambda: _small(Qwen3Config, Qwen3ForCausalLM),
        # a sliding window longer than every row: full causal attention
        "mistral": lambda: _small(MistralConfig, MistralForCausalLM, sliding_window=64),
    }


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_qwen_and_mistral_take_the_lean_forward_and_match_their_logits(family):
    model = _families()[family]().train()
    if family == "qwen2":  # q/k/v biases, drawn away from their zero init: exercised
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in ("q_proj", "k_proj", "v_proj"):
                    getattr(layer.self_attn, proj).bias.uniform_(-0.5, 0.5)
    if family == "qwen3":
        assert hasattr(model.model.layers[0].self_attn, "q_norm")
        with torch.no_grad():  # norms away from 1: a skipped norm changes the states
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    batch = collate(_rollouts(), 0)
    core = lp_mod._lean_core(model)
    assert core is not None  # the lean path is taken
    with torch.no_grad():
        states = lean_forward.completion_states(core, batch)
        mine = model.lm_head(states)
        theirs = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        theirs = theirs.logits[:, :-1][batch.mask.bool()]
    assert mine.shape == theirs.shape
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)
    _compare(model, batch)  # log-probs, entropies and gradients


def test_rows_longer_than_the_sliding_window_take_the_models_own_attention():
    from transformers import MistralConfig, MistralForCausalLM

    model = _small(MistralConfig, MistralForCausalLM, sliding_window=8).eval()
    batch = collate(_rollouts(), 0)  # rows of up to 20 tokens
    core = lp_mod._lean_core(model)
    assert core is not None and not lean_forward.fits(core, batch)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch, 1.0)
        with reference_impl():
            ref, _ = token_logprobs(model, batch, 1.0)
    m = batch.mask.bool()  # the full path fills every position
    assert float((lp - ref)[m].abs().max()) < 1e-5


def test_a_soft_capped_head_takes_the_chunked_head():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = _small(Gemma2Config, Gemma2ForCausalLM, final_logit_softcapping=2.0).eval()
    parts = lp_mod._split(model)
    assert parts is not None  # the chunked head, soft-capped (no full logits)
    batch = collate(_rollouts(), 0)
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch, 0.7)
        with reference_impl():
            ref, ref_ent = token_logprobs(model, batch, 0.7)
    m = batch.mask.bool()
    assert float((lp - ref)[m].abs().max()) < 1e-5
    assert float((ent - ref_ent)[m].abs().max()) < 1e-5


def test_rows_run_whole_are_packed_without_padding_with_the_padded_loss_and_gradients(
    monkeypatch,
):
    """Rows of different lengths run whole are packed into one row (positions restart per
    row, attention causal within each row): the same states, loss and gradients as the
    left-padded layout with its [rows, 1, T, T] mask."""
    monkeypatch.setattr(lean_forward, "_SHARE_MIN", 2.0)  # every row whole
    model = _llama().train()
    batch = collate(_rollouts(), 0)
    lay = lean_forward._Layout(batch, pack=True)
    assert lay.segments is not None and lay.prompt_ids.shape[0] == 1  # one packed row
    assert lay.prompt_ids.shape[1] == sum(lay.segments) < batch.input_ids.numel()
    out = []
    for pack in (True, False):
        model.zero_grad(set_to_none=True)
        states = lean_forward.completion_states(model, batch, pack=pack)
        logps = torch.log_softmax(model.lm_head(states).float(), -1)
        loss = -logps.gather(-1, batch.input_ids[:, 1:][batch.mask.bool()][:, None]).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((states.detach(), loss.detach(), grads))
    (s1, l1, g1), (s2, l2, g2) = out
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l1, l2, atol=1e-6, rtol=1e-6)
    assert g1.keys() == g2.keys() and g1
    for name, g in g2.items():
        torch.testing.assert_close(g1[name], g, atol=1e-5, rtol=1e-4)
