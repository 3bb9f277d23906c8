"""The lean Llama decoder (preallocated in-place KV cache) against transformers' own paths,
and the fallback to transformers' forward for other architectures."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import collate, token_logprobs
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.rollout.generation.decoders import HFDecoder, LlamaDecoder, llama_core, make_decoder

# prompts of 2 to 12 characters: every batch is left-padded, some rows heavily
PROMPTS = ["1+2=", "123+45678=", "9=", "77-3=", "400+12345678="]


def to_rollout(s) -> Rollout:
    return Rollout(
        prompt_ids=s.prompt_ids,
        completion_ids=s.completion_ids,
        behaviour_logprobs=s.logprobs,
        reward=0.0,
        advantage=0.0,
        correct=False,
        group_id=s.prompt_index,
        policy_version=0,
        step=0,
    )


@pytest.fixture(scope="module")
def gqa_llama(char_tokenizer) -> LlamaForCausalLM:
    """A random Llama with grouped-query attention (4 query heads per key/value head) and
    weights large enough that greedy choices are not near-ties."""
    cfg = LlamaConfig(
        vocab_size=len(char_tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny_gpt2(char_tokenizer) -> GPT2LMHeadModel:
    cfg = GPT2Config(
        vocab_size=len(char_tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()


def test_decoder_choice(gqa_llama, tiny_gpt2):
    assert llama_core(gqa_llama) is gqa_llama
    assert isinstance(make_decoder(gqa_llama, 8), LlamaDecoder)
    assert isinstance(make_decoder(gqa_llama, 8, lean=False), HFDecoder)
    assert llama_core(tiny_gpt2) is None
    assert isinstance(make_decoder(tiny_gpt2, 8), HFDecoder)


@pytest.mark.parametrize("samples", [1, 3])
def test_lean_greedy_equals_generate(gqa_llama, char_tokenizer, samples):
    """Greedy tokens identical to transformers' generate over 40 steps (rows finish at
    different steps, so finished rows are dropped from the cache mid-decode)."""
    params = SamplingParams(max_new_tokens=40, greedy=True)
    lean = HFGenerator(gqa_llama, char_tokenizer, batch_size=7, impl="fast")
    ref = HFGenerator(gqa_llama, char_tokenizer, batch_size=7, impl="generate")
    a, b = lean.generate(PROMPTS, samples, params), ref.generate(PROMPTS, samples, params)
    lengths = {s.completion_ids.numel() for s in b}
    assert len(lengths) > 1  # the case where rows are dropped is exercised
    for x, y in zip(a, b, strict=True):
        assert x.prompt_index == y.prompt_index
        assert x.completion_ids.tolist() == y.completion_ids.tolist()
        assert torch.allclose(x.logprobs, y.logprobs, atol=1e-4)


def test_lean_sampled_logprobs_equal_a_full_forward(gqa_llama, char_tokenizer):
    torch.manual_seed(5)
    gen = HFGenerator(gqa_llama, char_tokenizer, batch_size=6, impl="fast")
    samples = gen.generate(PROMPTS, 4, SamplingParams(temperature=0.8, max_new_tokens=30))
    batch = collate([to_rollout(s) for s in samples], char_tokenizer.pad_token_id)
    with torch.no_grad():
        logps, _ = token_logprobs(gqa_llama, batch, 0.8)
    mask = batch.mask.bool()
    assert int(mask.sum()) > 200
    assert float((logps - batch.old_logprobs)[mask].abs().max()) < 1e-4


def test_lean_equals_transformers_forward_under_lora(gqa_llama, char_tokenizer):
    """LoRA-wrapped projections are called as modules: same tokens as transformers' path."""
    peft = pytest.importorskip("peft")
    import copy

    model = peft.get_peft_model(
        copy.deepcopy(gqa_llama),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    with torch.no_grad():  # a trained adapter (B = 0 at init would change nothing)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.eval()
    assert llama_core(model) is not None
    params = SamplingParams(max_new_tokens=25, greedy=True)
    a = HFGenerator(model, char_tokenizer, batch_size=8, impl="fast").generate(PROMPTS, 2, params)
    b = HFGenerator(model, char_tokenizer, batch_size=8, impl="fast_hf").generate(
        PROMPTS, 2, params
    )
    base = HFGenerator(gqa_llama, char_tokenizer, batch_size=8).generate(PROMPTS, 2, params)
    assert [s.completion_ids.tolist() for s in a] == [s.completion_ids.tolist() for s in b]
    assert [s.completion_ids.tolist() for s in a] != [s.completion_ids.tolist() for s in base]
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x.logprobs, y.logprobs, atol=1e-4)


def test_other_architectures_fall_back(tiny_gpt2, char_tokenizer):
    params = SamplingParams(max_new_tokens=12, greedy=True)
    fast = HFGenerator(tiny_gpt2, char_tokenizer, batch_size=4, impl="fast")
    ref = HFGenerator(tiny_gpt2, char_tokenizer, batch_size=4, impl="generate")
    a, b = fast.generate(PROMPTS, 2, params), ref.generate(PROMPTS, 2, params)
    assert [s.completion_ids.tolist() for s in a] == [s.completion_ids.tolist() for s in b]


def test_more_steps_than_allocated_is_an_error(gqa_llama):
    dec = LlamaDecoder(gqa_llama, max_new_tokens=1)
    ids = torch.tensor([[5, 6, 7]])
    dec.prefill(ids, torch.ones_like(ids), torch.arange(3).unsqueeze(0))
    dec.step(torch.tensor([4]), torch.tensor([3]))
    with pytest.raises(RuntimeError, match="max_new_tokens"):
        dec.step(torch.tensor([4]), torch.tensor([4]))


def test_temperature_one_shortcut_samples_exactly_as_before():
    """sample_next skips `/ temperature` at T = 1: tokens and log-probs must be bit-identical
    to the division (the shortcut may change speed, never a sampled token)."""
    from replayrl.rollout.generation.sampling import _inverse_cdf, sample_next

    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(3)) * 4
    tokens, logps = sample_next(logits, 1.0, generator=torch.Generator().manual_seed(7))
    ref_logp = torch.log_softmax(logits / 1.0, dim=-1)
    ref = _inverse_cdf(ref_logp.exp(), torch.Generator().manual_seed(7))
    assert torch.equal(tokens, ref)
    assert torch.equal(logps, ref_logp.gather(-1, ref.unsqueeze(-1)).squeeze(-1))
    # other temperatures still divide
    t2, _ = sample_next(logits, 0.5, generator=torch.Generator().manual_seed(7))
    ref2 = _inverse_cdf(torch.log_softmax(logits / 0.5, -1).exp(), torch.Generator().manual_seed(7))
    assert torch.equal(t2, ref2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_float_mask_is_bit_identical_to_the_boolean_mask(gqa_llama, char_tokenizer, dtype):
    """Decode steps build one additive mask for all layers: every step's logits must equal
    those of SDPA's own boolean-mask path exactly (same tokens for a fixed seed), with
    left-padded rows and rows dropped between steps."""
    import copy

    model = copy.deepcopy(gqa_llama).to(dtype)
    ids = [char_tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    width = max(map(len, ids))
    input_ids = torch.zeros((len(ids), width), dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, x in enumerate(ids):
        input_ids[row, width - len(x) :] = torch.tensor(x)
        attention[row, width - len(x) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    outs = []
    for float_mask in (True, False):
        dec = LlamaDecoder(model, 6)
        dec.float_mask = float_mask
        with torch.no_grad():
            logits = [dec.prefill(input_ids, attention, positions)]
            pos = positions[:, -1] + 1
            tokens = logits[0].argmax(-1)
            for step in range(5):
                if step == 2:  # drop a row, as finished rows are
                    keep = torch.tensor([0, 2, 3, 4])
                    dec.select(keep)
                    tokens, pos = tokens[keep], pos[keep]
                logits.append(dec.step(tokens, pos))
                tokens, pos = logits[-1].argmax(-1), pos + 1
        outs.append(logits)
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    assert all(torch.isfinite(x).all() for x in outs[0])
