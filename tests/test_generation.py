"""HFGenerator samples vs. the learner's recomputed log-probs (collate + token_logprobs)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import collate, token_logprobs
from replayrl.rollout.generation import HFGenerator, Sample, SamplingParams

# Mixed prompt lengths (4, 10 and 2 characters) so every generation batch is left-padded
# differently from the right-padded learner batches.
PROMPTS = ["1+2=", "123+45678=", "9="]
NUM_SAMPLES = 4
MAX_NEW = 6
TOL = 1e-4


def to_rollout(s: Sample, reward: float = 0.0, advantage: float = 0.0) -> Rollout:
    return Rollout(
        prompt_ids=s.prompt_ids,
        completion_ids=s.completion_ids,
        behaviour_logprobs=s.logprobs,
        reward=reward,
        advantage=advantage,
        correct=False,
        group_id=s.prompt_index,
        policy_version=s.policy_version,
        step=0,
    )


@pytest.fixture(scope="module", params=["fast", "fast_hf", "generate"])
def generator(request, tiny_model, char_tokenizer) -> HFGenerator:
    # batch_size 5 < 12 jobs: batches straddle prompts, so padding differs per batch;
    # every test runs on every implementation (our decode loop on the lean Llama decoder and
    # on transformers' forward, and transformers' generate)
    return HFGenerator(
        tiny_model, char_tokenizer, batch_size=5, policy_version=7, impl=request.param
    )


@pytest.fixture(scope="module", params=[0.7, 1.0], ids=["T0.7", "T1.0"])
def sampled(request, generator) -> tuple[float, list[Sample]]:
    temperature = request.param
    torch.manual_seed(1234)
    params = SamplingParams(temperature=temperature, max_new_tokens=MAX_NEW)
    return temperature, generator.generate(PROMPTS, NUM_SAMPLES, params)


def _max_diff(model, rollouts: list[Rollout], pad_id: int, temperature: float) -> float:
    batch = collate(rollouts, pad_id)
    with torch.no_grad():
        logps, _ = token_logprobs(model, batch, temperature)
    mask = batch.mask.bool()
    # the mask marks exactly the completion tokens, and the targets there are those tokens
    assert int(mask.sum()) == sum(r.completion_ids.numel() for r in rollouts)
    targets = batch.input_ids[:, 1:]
    expected = torch.cat([r.completion_ids for r in rollouts])
    assert torch.equal(targets[mask], expected)
    return float((logps - batch.old_logprobs)[mask].abs().max())


def test_learner_recomputes_behaviour_logprobs(sampled, tiny_model, char_tokenizer):
    temperature, samples = sampled
    pad = char_tokenizer.pad_token_id
    rollouts = [to_rollout(s) for s in samples]
    # each sample alone (no padding at all)
    for r in rollouts:
        assert _max_diff(tiny_model, [r], pad, temperature) < TOL
    # all of them together, shuffled
    order = np.random.default_rng(0).permutation(len(rollouts))
    assert _max_diff(tiny_model, [rollouts[i] for i in order], pad, temperature) < TOL
    # pairs mixing the longest and shortest prompts
    long_short = [r for r in rollouts if r.group_id == 1][:2] + [
        r for r in rollouts if r.group_id == 2
    ][:2]
    assert _max_diff(tiny_model, long_short[::-1], pad, temperature) < TOL


def test_logprobs_are_those_of_the_tempered_policy(sampled, tiny_model, char_tokenizer):
    # the comparison above is sensitive: the wrong temperature is far off
    temperature, samples = sampled
    other = 1.0 if temperature != 1.0 else 0.7
    diff = _max_diff(
        tiny_model, [to_rollout(s) for s in samples], char_tokenizer.pad_token_id, other
    )
    assert diff > 1e-2


def test_samples_are_grouped_by_prompt(sampled, char_tokenizer):
    _, samples = sampled
    assert len(samples) == len(PROMPTS) * NUM_SAMPLES
    assert [s.prompt_index for s in samples] == [
        i for i in range(len(PROMPTS)) for _ in range(NUM_SAMPLES)
    ]
    for s in samples:
        expected = char_tokenizer(PROMPTS[s.prompt_index], add_special_tokens=False)["input_ids"]
        assert s.prompt_ids.tolist() == expected  # unpadded prompt tokens
        assert s.prompt_ids.dtype == torch.long
        assert s.logprobs.dtype == torch.float32
        assert s.logprobs.shape == s.completion_ids.shape
        assert bool((s.logprobs <= 0).all())
        assert s.policy_version == 7


def test_completions_stop_at_eos_or_are_truncated(generator, char_tokenizer):
    eos = char_tokenizer.eos_token_id
    torch.manual_seed(99)
    samples = generator.generate(
        PROMPTS, 16, SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
    )
    stopped = truncated = 0
    for s in samples:
        ids = s.completion_ids.tolist()
        assert 1 <= len(ids) <= MAX_NEW
        assert s.text == char_tokenizer.decode(ids, skip_special_tokens=True)
        assert "</s>" not in s.text
        if eos in ids:
            assert ids.index(eos) == len(ids) - 1  # EOS included, nothing after it
            assert not s.truncated
            stopped += 1
        else:
            assert s.truncated
            assert len(ids) == MAX_NEW  # ran out of tokens
            truncated += 1
    # with this seed the random tiny model produces both kinds
    assert stopped > 0
    assert truncated > 0


def test_single_token_budget(generator):
    torch.manual_seed(0)
    samples = generator.generate(["5+5="], 8, SamplingParams(max_new_tokens=1))
    assert all(s.completion_ids.numel() == 1 for s in samples)
    eos = generator.tokenizer.eos_token_id
    assert all(s.truncated == (int(s.completion_ids[0]) != eos) for s in samples)


def test_policy_version_is_stamped(generator):
    params = SamplingParams(max_new_tokens=2)
    try:
        generator.policy_version = 3
        assert {s.policy_version for s in generator.generate(["1+1="], 2, params)} == {3}
        generator.policy_version = 11
        assert {s.policy_version for s in generator.generate(["1+1="], 2, params)} == {11}
    finally:
        generator.policy_version = 7


def test_greedy_is_independent_of_batch_composition(generator):
    params = SamplingParams(max_new_tokens=MAX_NEW, greedy=True)
    together = generator.generate(PROMPTS, 1, params)
    for i, prompt in enumerate(PROMPTS):
        (alone,) = generator.generate([prompt], 1, params)
        assert alone.completion_ids.tolist() == together[i].completion_ids.tolist()
        assert torch.allclose(alone.logprobs, together[i].logprobs, atol=TOL)


def test_generate_restores_training_mode(generator):
    model = generator.model
    model.train()
    try:
        generator.generate(["1+1="], 1, SamplingParams(max_new_tokens=1, greedy=True))
        assert model.training
    finally:
        model.eval()
    generator.generate(["1+1="], 1, SamplingParams(max_new_tokens=1, greedy=True))
    assert not model.training


def test_collate_layout_by_hand():
    # row 0: prompt [5, 6, 7] + completion [8, 1]; row 1: prompt [5] + completion [9]; pad 0.
    # Token t is predicted by the logits at t - 1, so the completion mask starts at P - 1.
    r0 = Rollout(
        prompt_ids=torch.tensor([5, 6, 7]),
        completion_ids=torch.tensor([8, 1]),
        behaviour_logprobs=torch.tensor([-0.5, -0.25]),
        reward=1.0,
        advantage=0.5,
        correct=True,
        group_id=0,
        policy_version=0,
        step=0,
        group_mean_reward=0.75,
    )
    r1 = Rollout(
        prompt_ids=torch.tensor([5]),
        completion_ids=torch.tensor([9]),
        behaviour_logprobs=torch.tensor([-2.0]),
        reward=0.0,
        advantage=-0.5,
        correct=False,
        group_id=0,
        policy_version=0,
        step=0,
        group_mean_reward=0.75,
    )
    b = collate([r0, r1], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 1], [5, 9, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 0]]
    assert b.old_logprobs.tolist() == [[0, 0, -0.5, -0.25], [-2.0, 0, 0, 0]]
    assert b.advantages.tolist() == [0.5, -0.5]
    assert b.rewards.tolist() == [1.0, 0.0]
    assert b.baselines.tolist() == [0.75, 0.75]


def test_model_generation_config_does_not_truncate_sampling(tiny_model, char_tokenizer):
    # A model folder's generation_config.json with top_k=2 (as hub models ship top_k=20 ...).
    model = copy.deepcopy(tiny_model)
    model.generation_config.top_k = 2
    gen = HFGenerator(model, char_tokenizer)
    torch.manual_seed(0)
    samples = gen.generate(PROMPTS, 16, SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW))
    outside_top2 = total = 0
    for s in samples:
        ids = torch.cat([s.prompt_ids, s.completion_ids]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        p = s.prompt_ids.numel()
        for j, token in enumerate(s.completion_ids.tolist()):
            row = logits[p - 1 + j]
            outside_top2 += int((row > row[token]).sum()) >= 2
            total += 1
    # The stored log-probs claim the full softmax at T = 1 (checked above); under it the
    # near-uniform random model puts most mass outside its top 2 (214 of 257 sampled tokens
    # with this seed and no top_k). With the model's top_k leaking in, none ever are.
    assert outside_top2 > total // 2


def test_fast_and_generate_agree_when_greedy(tiny_model, char_tokenizer):
    params = SamplingParams(max_new_tokens=MAX_NEW, greedy=True)
    fast = HFGenerator(tiny_model, char_tokenizer, batch_size=5, impl="fast")
    ref = HFGenerator(tiny_model, char_tokenizer, batch_size=5, impl="generate")
    # 3 completions per prompt: the shared prefill is expanded to 3 rows per prompt
    a, b = fast.generate(PROMPTS, 3, params), ref.generate(PROMPTS, 3, params)
    assert [s.prompt_index for s in a] == [s.prompt_index for s in b]
    for x, y in zip(a, b, strict=True):
        assert x.completion_ids.tolist() == y.completion_ids.tolist()
        assert x.truncated == y.truncated
        assert torch.allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_fast_batches_split_groups_at_the_batch_size(tiny_model, char_tokenizer):
    gen = HFGenerator(tiny_model, char_tokenizer, batch_size=5)
    batches = gen._fast_batches([[1], [2], [3]], 4)
    assert [[(i, n) for i, _, n in b] for b in batches] == [
        [(0, 4), (1, 1)],
        [(1, 3), (2, 2)],
        [(2, 2)],
    ]


def test_bfloat16_copy_follows_the_policy_weights(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model)
    gen = HFGenerator(model, char_tokenizer, batch_size=8, dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=MAX_NEW, greedy=True)
    before = gen.generate(PROMPTS, 1, params)
    assert model.dtype == torch.float32  # the master weights are untouched
    assert next(gen._copy.parameters()).dtype == torch.bfloat16
    with torch.no_grad():  # a "training step": the policy changes a lot
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    after = gen.generate(PROMPTS, 1, params)
    want = HFGenerator(model, char_tokenizer, batch_size=8).generate(PROMPTS, 1, params)
    assert any(
        x.completion_ids.tolist() != y.completion_ids.tolist()
        for x, y in zip(before, after, strict=True)
    )
    for x, y in zip(after, want, strict=True):
        # bf16 rounds the logits: the log-probs are close, not equal
        assert torch.allclose(x.logprobs[:1], y.logprobs[:1], atol=0.1)


def test_config_selects_the_generation_implementation(tiny_model, char_tokenizer):
    """rollout.generation_impl reaches the generator; `generate` draws with
    torch.multinomial (transformers), so under one seed its samples differ from `fast`'s."""
    from replayrl.config.schema import load_config
    from replayrl.rollout.generation import make_generator

    impls = {}
    for impl in ("fast", "generate"):
        cfg = load_config(None, [f"rollout.generation_impl={impl}"])
        gen = make_generator(cfg, tiny_model, char_tokenizer, "tiny")
        assert isinstance(gen, HFGenerator) and gen.impl == impl
        torch.manual_seed(0)
        impls[impl] = [
            s.completion_ids.tolist()
            for s in gen.generate(PROMPTS, 4, SamplingParams(max_new_tokens=MAX_NEW))
        ]
    assert load_config(None, []).rollout.generation_impl == "fast"
    assert impls["fast"] != impls["generate"]
