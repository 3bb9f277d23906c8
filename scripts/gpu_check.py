"""GPU timing and precision check (scripts/gpu_check.sh runs it on a CUDA machine).

    PYTHONPATH=src python scripts/gpu_check.py --out gpu_check_out

Builds a randomly initialised Llama of SmolLM2-135M's shape (the real weights are too big to
bring to a machine without network; a random model's timing is the same), then trains
10 GRPO steps and 10 replay steps on it with the CLI's own code on `train.device=cuda`, and
prints per run: step times, generated and trained tokens per second, peak GPU memory; then
the log-prob mismatch between bf16 autocast and fp32 on the same model and tokens.
`--shape tiny --device cpu` runs the same code small on a CPU (the tests do).

`--sharded ROWSxTOKENS` (scripts/gpu_check.sh passes 8x1024) adds one sharded learner step:
FSDP2 over a mesh of one rank (the sharded learners' code path: chunked head, lean forward
as layer-group forward methods, bf16 gathered parameters, fp32 reduction, gradient
checkpointing) on a Qwen2.5-0.5B-shaped Qwen2 model (24 layers, vocabulary 151,936; random
weights), with its step time and peak GPU memory: the bf16 memory row of that shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M-Instruct config.json)
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
}
# Qwen2.5-0.5B's config.json shapes (Qwen2: q/k/v biases, tied head)
QWEN25_05B: dict[str, Any] = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
RUNS = {"grpo": [], "replay": []}  # preset -> extra overrides


def sharded_step(device: str, rows: int, tokens: int, shape: dict[str, Any]) -> dict[str, Any]:
    """One sharded learner step on a mesh of one rank: seconds, peak memory, loss."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from replayrl.bench.speed import random_rollouts
    from replayrl.config.schema import load_config
    from replayrl.learner.learner import Learner
    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import free_port, init_group

    init_group(0, 1, "127.0.0.1", free_port(), device=device)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(device)
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    cfg = load_config(
        None,
        [
            f"train.device={device}",
            f"train.micro_batch_size={rows}",
            f"train.sharding_param_dtype={dtype}",
        ],
    )
    learner = Learner(model, 0, cfg)
    fsdp.shard_learner(learner, 1)
    batch = random_rollouts(shape["vocab_size"], rows, 64, tokens)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = learner.train_step(batch, __import__("numpy").random.default_rng(0), step=0)
    if cuda:
        torch.cuda.synchronize()
    out = {
        "rows": rows,
        "tokens": tokens,
        "layers": shape["num_hidden_layers"],
        "param_dtype": dtype,
        "seconds": round(time.perf_counter() - t0, 2),
        "loss": metrics["loss"],
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    torch.distributed.destroy_process_group()
    return out


def build_model_folder(folder: Path, shape: str, seed: int = 0) -> Path:
    """A random Llama of `shape` with the arithmetic task's character tokenizer, saved as a
    model folder (model.path); the vocabulary is the shape's (unused ids are never drawn
    by the tokenizer but are sampled by the random model, as a real one's would be)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from replayrl.models.loading import build_char_tokenizer
    from replayrl.rollout.tasks import ArithmeticTask

    tok = build_char_tokenizer(ArithmeticTask().corpus())
    cfg = LlamaConfig(
        **SHAPES[shape],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def logprob_mismatch(model: torch.nn.Module, vocab: int, device: str, seed: int = 0) -> dict:
    """|log pi_bf16 - log pi_fp32| per token on 16 random sequences of 128 tokens (the
    learner's own log-prob code, autocast to bf16 vs none)."""
    from replayrl.learner.batching import TokenRows
    from replayrl.learner.logprobs import token_logprobs

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (16, 128), generator=g)
    batch = TokenRows(
        input_ids=ids.to(device),
        attention_mask=torch.ones_like(ids).to(device),
        mask=torch.ones((16, 127), device=device),
    )
    model = model.to(device).eval()
    with torch.no_grad():
        fp32, _ = token_logprobs(model, batch, 1.0, autocast=None)
        bf16, _ = token_logprobs(model, batch, 1.0, autocast=torch.bfloat16)
    diff = (bf16 - fp32).abs()
    return {
        "mean_abs": float(diff.mean()),
        "max_abs": float(diff.max()),
        "ratio_outside_0.8_1.2": float(((bf16 - fp32).exp() - 1).abs().gt(0.2).float().mean()),
    }


def step_figures(run_dir: Path) -> dict[str, float]:
    """Step times and tokens/s from a run folder's metrics.jsonl and summary.json."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/training_s" in r]
    gen = [r.get("time/generation_s", 0.0) for r in steps]
    train = [r["time/training_s"] for r in steps]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "steps": len(steps),
        "step_s_median": statistics.median(g + t for g, t in zip(gen, train, strict=True)),
        "generation_s_median": statistics.median(gen),
        "training_s_median": statistics.median(train),
        "generated_tokens_per_s": summary["tokens_generated"] / max(sum(gen), 1e-9),
        "trained_tokens_per_s": summary["tokens_trained"] / max(sum(train), 1e-9),
    }


def train_run(
    preset: str, model_dir: Path, out: Path, device: str, steps: int, extra: list[str]
) -> dict:
    from replayrl.cli.main import main

    overrides = [
        f"model.path={model_dir}",
        f"train.device={device}",
        f"train.steps={steps}",
        "rollout.max_new_tokens=64",
        "eval.every=0",
        "eval.num_prompts=32",
        "logging.tensorboard=false",
        "logging.progress=false",
        "logging.overwrite=true",
        f"logging.run_dir={out}",
        f"logging.name={preset}",
        *RUNS[preset],
        *extra,
    ]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    code = main(["train", "--config", preset, *overrides])
    if code != 0:
        raise SystemExit(f"{preset}: replayrl train exited {code}")
    figures = {"wall_s": time.perf_counter() - t0, **step_figures(out / preset)}
    if device.startswith("cuda"):
        figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return figures


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--set", nargs="*", default=[], help="more config overrides for both runs")
    p.add_argument(
        "--work", type=Path, default=None,
        help="the model and the runs' checkpoints (default: a temporary folder), kept out of "
        "--out so that only gpu_check.json comes back",
    )  # fmt: skip
    p.add_argument(
        "--sharded", default=None, metavar="ROWSxTOKENS",
        help="also one sharded (FSDP2, mesh of one) learner step of that size on the "
        "Qwen2.5-0.5B shape (--shape tiny: a tiny Qwen2)",
    )  # fmt: skip
    p.add_argument("--skip-runs", action="store_true", help="only the --sharded step")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="replayrl-gpu-check-"))
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"environment": environment(), "shape": args.shape}
    print(json.dumps(report["environment"]), flush=True)
    if args.sharded:
        rows, tokens = (int(x) for x in args.sharded.lower().split("x"))
        shape = QWEN25_05B if args.shape != "tiny" else {**SHAPES["tiny"], "vocab_size": 64}
        report["sharded_step"] = sharded_step(args.device, rows, tokens, shape)
        print("sharded step", json.dumps(report["sharded_step"]), flush=True)
    if args.skip_runs:
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
        return 0
    model_dir = build_model_folder(work / "model", args.shape)
    for preset in RUNS:
        report[preset] = train_run(
            preset, model_dir, work / "runs", args.device, args.steps, args.set
        )
        print(preset, json.dumps(report[preset]), flush=True)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = SHAPES[args.shape]["vocab_size"]
    report["bf16_vs_fp32_logprobs"] = logprob_mismatch(model, vocab, args.device)
    print("bf16 vs fp32 log-probs", json.dumps(report["bf16_vs_fp32_logprobs"]), flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
