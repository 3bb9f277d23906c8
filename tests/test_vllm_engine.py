"""VLLMGenerator on the real vLLM engine (CPU build, `make test-vllm`; skipped where vLLM is not
installed): samples reproduce, its log-probs are the learner's, and after a weight sync the
engine computes with the learner's weights (tied and untied heads, LoRA merged, sharded
parameters gathered one at a time, the folder path of an out-of-process engine)."""

from __future__ import annotations

import copy
import gc
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the real-engine tier needs vllm (make test-vllm)")

from replayrl.config.schema import ModelConfig  # noqa: E402
from replayrl.learner.batching import collate  # noqa: E402
from replayrl.learner.logprobs import token_logprobs  # noqa: E402
from replayrl.models.loading import build_tiny_model  # noqa: E402
from replayrl.rollout.generation import Sample, SamplingParams  # noqa: E402
from replayrl.rollout.generation.vllm import VLLMGenerator, write_weights_folder  # noqa: E402
from replayrl.rollout.generation.vllm_settings import VLLMConfig  # noqa: E402
from tiny import as_rollouts  # noqa: E402

pytestmark = pytest.mark.vllm

# head size 32: the smallest the CPU build's attention takes (16 is refused at generate)
ENGINE_TINY = {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128}
PROMPTS = ["1+2=", "12+34=", "7+80="]
SAMPLE = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8)
TOL = 1e-4  # engine vs learner fp32 log-probs


@pytest.fixture(scope="module", autouse=True)
def _small_engine_env():
    """One engine of ~2 GB: 1 GiB of KV cache (the default takes a share of all memory)."""
    old = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    yield
    if old is None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = old


def tiny_llama(char_tokenizer, seed: int = 0, tied: bool = True) -> torch.nn.Module:
    model = build_tiny_model(
        ModelConfig.model_validate({"tiny": ENGINE_TINY}), len(char_tokenizer), seed
    )
    if not tied:  # a head of its own, different from the embedding
        model.config.tie_word_embeddings = False
        head = torch.nn.Linear(model.config.hidden_size, len(char_tokenizer), bias=False)
        with torch.no_grad():
            head.weight.copy_(torch.randn_like(head.weight) * 0.2)
        model.lm_head = head
    return model.eval()


def engine_for(model: torch.nn.Module, tokenizer, folder: Path, seed: int = 0) -> VLLMGenerator:
    # a context longer than one KV block of the CPU build (128 tokens): prefix caching shows
    model.config.max_position_embeddings = 256
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = VLLMConfig(enforce_eager=True, max_model_len=192)
    return VLLMGenerator(str(folder), tokenizer, cfg, dtype="float32", seed=seed)


def perturbed(model: torch.nn.Module, scale: float = 0.3, seed: int = 1) -> torch.nn.Module:
    """A learner step's worth of change (and more): every parameter moved."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def learner_logprobs(model: torch.nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
    """The learner's fp32 log pi(token) of each sample's completion (temperature 1)."""
    rollouts = as_rollouts(samples, [0.0] * len(samples))
    batch = collate(rollouts, pad_id=0)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch, 1.0)
    mask = batch.mask.bool()
    return [lp[i][mask[i]] for i in range(len(samples))]


def max_gap(engine: VLLMGenerator, model: torch.nn.Module) -> float:
    """Largest |engine - learner| log-prob over sampled completions of every prompt."""
    samples = engine.generate(PROMPTS, 4, SAMPLE)
    assert sum(s.completion_ids.numel() for s in samples) > 12
    learner = learner_logprobs(model, samples)
    return max((s.logprobs - lp).abs().max().item() for s, lp in zip(samples, learner, strict=True))


@pytest.fixture(scope="module")
def tied(char_tokenizer, tmp_path_factory) -> tuple[VLLMGenerator, torch.nn.Module]:
    """The module's one engine (tied embeddings, the tiny model's default) and its policy;
    tests that push other weights push these back before they end."""
    model = tiny_llama(char_tokenizer)
    engine = engine_for(model, char_tokenizer, tmp_path_factory.mktemp("tied"))
    yield engine, model
    del engine
    gc.collect()


def test_samples_reproduce_and_follow_the_version(tied):
    engine, _ = tied
    engine.policy_version = 3
    first = engine.generate(PROMPTS, 4, SAMPLE)
    engine.policy_version = 4
    other = engine.generate(PROMPTS, 4, SAMPLE)
    engine.policy_version = 3  # a resumed run at version 3: the same draws again
    again = engine.generate(PROMPTS, 4, SAMPLE)
    ids = [[s.completion_ids.tolist() for s in out] for out in (first, other, again)]
    assert ids[0] == ids[2]
    assert ids[0] != ids[1]
    # the four samples of a prompt are not one sample four times
    assert len({tuple(x) for x in ids[0][:4]}) > 1
    assert all(s.policy_version == 3 for s in again)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a.logprobs, b.logprobs)


def test_sampled_logprobs_are_the_learners(tied):
    engine, model = tied
    assert max_gap(engine, model) < TOL


def test_greedy_is_the_argmax(tied):
    engine, model = tied
    samples = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, greedy=True))
    for s in samples:
        ids = torch.cat([s.prompt_ids, s.completion_ids])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, s.prompt_ids.numel() - 1 : -1]
        assert torch.equal(logits.argmax(-1), s.completion_ids)


def test_synced_weights_are_the_learners_with_a_tied_head(tied):
    engine, model = tied
    stepped = perturbed(model)
    assert max_gap(engine, stepped) > 0.1  # the check can tell the two apart
    engine.load_weights(stepped.named_parameters(), version=7)
    assert engine.policy_version == 7
    assert max_gap(engine, stepped) < TOL
    engine.load_weights(model.named_parameters(), version=0)
    assert max_gap(engine, model) < TOL


def test_a_sync_drops_keys_and_values_cached_with_the_old_weights(tied):
    engine, model = tied
    long = ["+".join(str(i) for i in range(50)) + "="]  # 140 tokens: a full block is cached
    engine.generate(long, 1, SAMPLE)
    stepped = perturbed(model, seed=6)
    engine.load_weights(stepped.named_parameters(), version=8)
    samples = engine.generate(long, 4, SAMPLE)
    learner = learner_logprobs(stepped, samples)
    gap = max((s.logprobs - lp).abs().max().item() for s, lp in zip(samples, learner, strict=True))
    engine.load_weights(model.named_parameters(), version=0)
    assert gap < TOL


def test_lora_policy_syncs_merged_weights(tied, char_tokenizer):
    pytest.importorskip("peft")
    from replayrl.models.loading import apply_lora, unwrap_model

    engine, model = tied
    lora_cfg = ModelConfig.model_validate(
        {"tiny": ENGINE_TINY, "lora": {"enabled": True, "r": 2, "alpha": 8}}
    )
    policy = apply_lora(copy.deepcopy(model), lora_cfg, seed=0)
    with torch.no_grad():  # trained adapters: B != 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p))
    assert max_gap(engine, policy) > 0.1
    engine.lora_scaling = lora_cfg.lora.alpha / lora_cfg.lora.r
    try:
        engine.load_weights(unwrap_model(policy).named_parameters(), version=1)
        assert max_gap(engine, policy) < TOL
    finally:
        engine.lora_scaling = None
        engine.load_weights(model.named_parameters(), version=0)


class _CountingTensor:
    """Stands for a sharded parameter: `full_tensor()` makes the whole tensor, and the test
    counts how many of those are alive at once."""

    alive: weakref.WeakSet = weakref.WeakSet()
    peak = 0

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def full_tensor(self) -> torch.Tensor:
        full = self.t.clone()
        _CountingTensor.alive.add(full)
        _CountingTensor.peak = max(_CountingTensor.peak, len(_CountingTensor.alive))
        return full


def test_sharded_parameters_are_gathered_one_at_a_time(tied):
    engine, model = tied
    stepped = perturbed(model, seed=2)
    params = list(stepped.named_parameters())
    _CountingTensor.alive, _CountingTensor.peak = weakref.WeakSet(), 0

    def sharded() -> Iterator[tuple[str, _CountingTensor]]:
        for name, p in params:
            yield name, _CountingTensor(p.detach())
            gc.collect()  # what the engine has let go of is gone before the next one

    engine.load_weights(sharded(), version=2)  # type: ignore[arg-type]
    assert max_gap(engine, stepped) < TOL
    # vLLM keeps a layer's tensors until the layer is complete (at most a Llama block's
    # attention or MLP: 4 here), never the whole model (the tiny model has 21 parameters)
    assert len(params) > 12
    assert 1 <= _CountingTensor.peak <= 4
    engine.load_weights(model.named_parameters(), version=0)


def test_out_of_process_path_reads_a_folder_of_bounded_shards(tied, tmp_path):
    engine, model = tied
    stepped = perturbed(model, seed=3)
    # the folder writer alone: shards bounded in bytes, a tied head saved as its own copy
    named = [*stepped.named_parameters(), ("lm_head.weight", stepped.model.embed_tokens.weight)]
    largest = max(p.numel() * 4 for _, p in named)
    assert write_weights_folder(named, tmp_path, bucket_bytes=largest) >= len(named) // 3
    assert all(f.stat().st_size <= largest + 4096 for f in tmp_path.glob("*.safetensors"))
    # the engine reads such a folder (what an engine in another process is sent)
    engine.in_process = False
    try:
        engine.load_weights(stepped.named_parameters(), version=5)
        assert max_gap(engine, stepped) < TOL
        folder = engine._weights_folder()
        assert folder.parent == Path("/dev/shm") or not Path("/dev/shm").is_dir()
    finally:
        engine.in_process = True
        engine.load_weights(model.named_parameters(), version=0)
    assert max_gap(engine, model) < TOL


def test_untied_head_syncs(tied, char_tokenizer, tmp_path):
    engine, _ = tied  # the module's engine stays: this one is built next to it, then freed
    model = tiny_llama(char_tokenizer, seed=4, tied=False)
    own = engine_for(model, char_tokenizer, tmp_path / "untied", seed=1)
    try:
        assert not own.tied_head
        assert max_gap(own, model) < TOL
        stepped = perturbed(model, seed=5)
        own.load_weights(stepped.named_parameters(), version=1)
        assert max_gap(own, stepped) < TOL
    finally:
        del own
        gc.collect()
