"""Seconds per weight sync into a real vLLM engine, and a generation speed row (the engine
against our own decoder and HF generate on the same model), on CPU with vLLM's CPU build.

The model has SmolLM2-135M's shape (30 layers, 576 wide, 9 heads of 64, 3 KV heads, vocabulary
49,152, tied embeddings) with random weights, built here: nothing is downloaded. The tokenizer
is any local tokenizer folder of that vocabulary (BENCHMARKS.md says which was used).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=src \\
        .venv-vllm/bin/python benchmarks/vllm_cpu.py --tokenizer DIR --out OUT.json

Prints and writes one JSON object: the sync figures (in-process iterator, and the
safetensors folder an engine in another process reads) and tokens per second of each
generator (after an untimed warm-up call each). Every generator runs on one thread (vLLM
binds its process to one), fp32, in one process, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from replayrl.rollout.generation import SamplingParams
from replayrl.rollout.generation.hf import HFGenerator
from replayrl.rollout.generation.vllm_settings import VLLMConfig

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
)
PROMPTS = ["What is 12 plus 30?", "Name a prime number.", "Count to five.", "Say hello."]


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), "")


def timed(fn, repeats: int) -> float:
    """The fastest of `repeats` calls, in seconds (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a local tokenizer folder (49,152 ids)")
    ap.add_argument("--out", required=True, help="where the JSON result is written")
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="syncs timed (the fastest kept)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from replayrl.rollout.generation.vllm import VLLMGenerator  # imports vllm

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory(prefix="smollm2-shape-") as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        t0 = time.perf_counter()
        cfg = VLLMConfig(enforce_eager=True, max_model_len=256)
        engine = VLLMGenerator(folder, tokenizer, cfg, dtype="float32", seed=0)
        start_s = time.perf_counter() - t0

        def sync() -> None:
            engine.load_weights(model.named_parameters(), engine.policy_version + 1)

        in_process = timed(sync, args.repeats)
        engine.in_process = False  # the folder an engine in another process would read
        folder_s = timed(sync, args.repeats)
        engine.in_process = True

        params_gen = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
        speed = {}
        for name, gen in [
            ("vllm", engine),
            ("replayrl_fast", HFGenerator(model, tokenizer, 64, impl="fast")),
            ("hf_generate", HFGenerator(model, tokenizer, 64, impl="generate")),
        ]:
            gen.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2))  # warm-up, untimed
            torch.manual_seed(0)
            t0 = time.perf_counter()
            samples = gen.generate(PROMPTS, args.samples, params_gen)
            seconds = time.perf_counter() - t0
            tokens = sum(s.completion_ids.numel() for s in samples)
            speed[name] = {"tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds}
    result = {
        "model": "SmolLM2-135M shape, random weights, fp32",
        "parameters": params,
        "sync_bytes": params * 4 + SMOLLM2_135M["vocab_size"] * 576 * 4,  # + the tied head
        "engine_start_s": start_s,
        "sync_s": {"in_process_iterator": in_process, "shm_folder": folder_s},
        "speed": speed,
        "prompts": len(PROMPTS),
        "samples": args.samples,
        "new_tokens": args.new_tokens,
        "threads": 1,
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": __import__("vllm").__version__,
    }
    text = json.dumps(result, indent=1)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, args.out)
    print(text)


if __name__ == "__main__":
    main()
