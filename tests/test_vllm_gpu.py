"""The vLLM weight push on a real engine (scripts/gpu_check.sh runs it where vLLM and a CUDA
GPU exist; skipped elsewhere): pushed weights change what the engine samples, and pushing the
original weights back restores it."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.mark.gpu
def test_weight_push_reaches_the_engine(tmp_path, tiny_model, char_tokenizer):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from replayrl.rollout.generation import SamplingParams
    from replayrl.rollout.generation.vllm import VLLMGenerator
    from replayrl.rollout.generation.vllm_settings import VLLMConfig

    tiny_model.save_pretrained(tmp_path / "m")
    char_tokenizer.save_pretrained(tmp_path / "m")
    cfg = VLLMConfig(gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=64)
    engine = VLLMGenerator(str(tmp_path / "m"), char_tokenizer, cfg, dtype="float32", seed=0)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)

    def completions() -> list[list[int]]:
        return [s.completion_ids.tolist() for s in engine.generate(["12+34="], 1, greedy)]

    before = completions()
    changed = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn_like(p))
    engine.load_weights(changed.named_parameters(), 1)
    assert completions() != before
    engine.load_weights(tiny_model.named_parameters(), 2)
    assert completions() == before
