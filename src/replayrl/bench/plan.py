"""`replayrl plan`: the per-GPU memory of a run, from its config, before any GPU is touched.

Each learner rank and each generator worker owns one GPU. The learner GPU holds:

- the policy: weights in `model.dtype`, gradients and AdamW's two moments for the trainable
  parameters (all of them, or the LoRA adapters only), divided by the number of ranks that
  shard it under `train.sharding=fsdp` (workers.learners / train.sharding_replicas); under
  sharding, the largest gathered group (the root group: embedding and norm, plus an untied
  output head) and two decoder layers (one computing, one prefetched) in the gathered dtype
  (`train.sharding_param_dtype`; auto = bfloat16, since a plan is for GPUs);
- activations and the chunked output head of one micro-batch: `bench/memory.py`'s formula()
  terms (checked there against measured peaks), activations and vocab x hidden temporaries
  scaled to the compute dtype, the chunk's logits kept in fp32; with gradient checkpointing
  the larger of the head's backward and a layer's recomputation (its activations and the
  MLP's gradient temporaries of its backward), which do not overlap;
- the KL reference (kl.beta > 0, full fine-tuning: a frozen copy, sharded like the policy;
  LoRA: the base with adapters off, no copy);
- PPO's critic (algorithm.advantage = gae): fp32 weights, gradients and AdamW state, sharded
  over the learners like the policy, plus its activations.

A generator GPU holds vLLM's reservation, `vllm.gpu_memory_utilization` x the GPU; the plan
also says what the engine needs inside it: bf16 weights plus the KV cache of its share of a
step's completions (2 x layers x kv heads x head dim x rows x tokens, bf16).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from replayrl.algorithms.advantages import ADVANTAGES
from replayrl.bench.memory import SHAPES, formula
from replayrl.config.schema import Config
from replayrl.rollout.generation.vllm_settings import vllm_settings

GIB = 1 << 30
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_shape(cfg: Config, shape: str | None = None) -> dict[str, Any]:
    """The model's config values: a named shape, else `model.path`'s config.json."""
    if shape is not None:
        return dict(SHAPES[shape])
    if cfg.model.path is None:
        raise ValueError("replayrl plan needs model.path (a folder with config.json) or --shape")
    path = Path(cfg.model.path) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: give a local model folder or --shape NAME")
    c = json.loads(path.read_text())
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("tie_word_embeddings", False)  # transformers' default for most decoders
    return c


def _dims(c: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """hidden, intermediate, vocabulary, layers, kv width (kv heads x head dim)."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    kv = c["num_key_value_heads"] * c.get("head_dim", h // heads)
    return h, c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"], kv


def param_counts(c: dict[str, Any]) -> dict[str, int]:
    """Parameters: per decoder layer, the root group (embedding, final norm, untied head)."""
    h, inter, v, _, kv = _dims(c)
    # q and o (h x h), k and v (h x kv), the MLP, two norms, q/k/v biases (Qwen2's; a Llama
    # without them is over-counted by 1 / h). formula() counts 4 h x h, a measured-shape detail
    # that over-states large models by ~8%, so the plan counts the projections themselves.
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h + h + 2 * kv
    root = v * h * (1 if c.get("tie_word_embeddings") else 2) + h
    return {"layer": layer, "root": root, "total": root + c["num_hidden_layers"] * layer}


def lora_params(c: dict[str, Any], r: int, targets: list[str]) -> int:
    """Adapter parameters: r x (in + out) for each targeted projection of every layer."""
    h, inter, _, layers, kv = _dims(c)
    io = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    return layers * sum(r * sum(io[t]) for t in targets if t in io)


def shard_ranks(cfg: Config) -> int:
    """The ranks one copy of the policy is split over (1 without sharding)."""
    if cfg.train.sharding != "fsdp":
        return 1
    return max(1, cfg.workers.learners // cfg.train.sharding_replicas)


def micro_rows(cfg: Config, seq: int) -> int:
    """Rows of one micro-batch: micro_batch_size, or fewer under the token budget."""
    rows = cfg.train.micro_batch_size
    if cfg.train.max_tokens_per_micro_batch is not None:
        rows = min(rows, max(1, cfg.train.max_tokens_per_micro_batch // seq))
    return rows


def _checkpointing(cfg: Config) -> bool:
    # on by default under sharding unless model.gradient_checkpointing was set (schema)
    if "gradient_checkpointing" in cfg.model.model_fields_set:
        return cfg.model.gradient_checkpointing
    return cfg.model.gradient_checkpointing or cfg.train.sharding == "fsdp"


def _step_terms(cfg: Config, c: dict[str, Any], prompt: int, lora: bool) -> dict[str, int]:
    """formula()'s activation and head terms for one micro-batch, in the compute dtype."""
    completion = cfg.rollout.max_new_tokens
    rows = micro_rows(cfg, prompt + completion)
    spec = {
        "config": c,
        "model": "",
        "kind": "lora" if lora else "full",
        "layers": c["num_hidden_layers"],
        "rows": rows,
        "tokens": completion,
        "prompt": prompt,
        "checkpointing": _checkpointing(cfg),
    }
    acts = formula(spec)["activations"]
    head = formula({**spec, "kind": "lm-head"})
    scale = _compute_bytes(cfg) / 4  # formula() counts fp32; the chunk's logits stay fp32
    head_bytes = int((head["weight_grad"] + 3 * head["states_grad"]) * scale) + head["chunk"]
    if spec["checkpointing"]:
        # formula() adds the recomputed layer's activations to the head's temporaries, but
        # backward recomputes layers only after the head's chunks and states' gradients are
        # freed; one vocab x hidden weight gradient stays until the tied embedding's joins
        # it. The phases' larger one counts (2-rank gloo head probe: within 5% at 1 and 16
        # rows, where the sum over-states 16 rows by 18%).
        layer = formula({**spec, "layers": 1, "checkpointing": False})["activations"]
        recompute = int(layer * scale) + int(head["weight_grad"] / 2 * scale)
        # while the recomputed layer's activations are still held, its backward adds the
        # MLP's gradients: at the down projection's input, then at the gate and up outputs
        # (3 tokens x intermediate tensors) before the activations they replace are freed.
        # It grows with rows x tokens, so it is what long rows peak on: without it the plan
        # was 14% under the 2-rank probe at 8 x 1,024 tokens (BENCHMARKS.md).
        recompute += int(3 * _tokens(spec) * c["intermediate_size"] * 4 * scale)
        acts = int((acts - layer) * scale) + max(0, recompute - head_bytes)
    else:
        acts = int(acts * scale)
    return {"activations": acts, "head": head_bytes, "rows": rows}


def _tokens(spec: dict[str, Any]) -> int:
    """Positions a micro-batch runs (formula()'s count: prompt + completion - 1 per row)."""
    return int(spec["rows"] * (spec["prompt"] + spec["tokens"] - 1))


def _compute_bytes(cfg: Config) -> int:
    if cfg.train.sharding == "fsdp" and cfg.train.sharding_param_dtype != "auto":
        return _BYTES[cfg.train.sharding_param_dtype]
    if cfg.train.sharding == "fsdp":
        return 2  # auto: bfloat16 on CUDA
    return _BYTES[cfg.model.dtype]


def learner_terms(cfg: Config, c: dict[str, Any], prompt: int) -> dict[str, int]:
    """Bytes per learner GPU by term (module docstring)."""
    counts = param_counts(c)
    lora = cfg.model.lora.enabled
    trainable = (
        lora_params(c, cfg.model.lora.r, list(cfg.model.lora.target_modules))
        if lora
        else counts["total"]
    )
    store, n = _BYTES[cfg.model.dtype], shard_ranks(cfg)
    # LoRA adapters live inside the sharded layers, so they shard with them
    terms = {
        "weights": math.ceil(counts["total"] * store / n) + (trainable * store // n if lora else 0),
        "grads": math.ceil(trainable * store / n),
        "optimizer": math.ceil(2 * trainable * store / n),
        "gathered": 0,
        "reference": 0,
        "critic": 0,
    }
    if n > 1:  # FSDP's unsharded groups while they compute
        terms["gathered"] = (counts["root"] + 2 * counts["layer"]) * _compute_bytes(cfg)
    step = _step_terms(cfg, c, prompt, lora)
    terms["activations"], terms["head"] = step["activations"], step["head"]
    if cfg.kl.beta > 0 and not lora:
        terms["reference"] = math.ceil(counts["total"] * store / n)
    if ADVANTAGES.get(
        cfg.algorithm.advantage
    ).needs_critic:  # fp32 weights, grads, AdamW, sharded like the policy
        terms["critic"] = math.ceil(
            16 * (counts["total"] - counts["root"] + c["vocab_size"] * c["hidden_size"]) / n
        )
        # its forward runs in the policy's compute dtype (autocast, or the sharded gather's)
        terms["critic"] += step["activations"]
    return terms


def generator_terms(cfg: Config, c: dict[str, Any], prompt: int, gpu: float) -> dict[str, int]:
    """Bytes per generator GPU: vLLM's reservation and what the engine needs inside it."""
    _, _, _, layers, kv = _dims(c)
    seq = vllm_settings(cfg).max_model_len or prompt + cfg.rollout.max_new_tokens
    rows = min(
        cfg.rollout.decode_batch_size, math.ceil(cfg.rollouts_per_step / cfg.workers.generators)
    )
    return {
        "reserved": int(vllm_settings(cfg).gpu_memory_utilization * gpu * GIB),
        "weights": 2 * param_counts(c)["total"],
        "kv_cache": 2 * layers * kv * rows * seq * 2,
        "rows": rows,
        "tokens": seq,
    }


def plan(cfg: Config, shape: str | None, prompt: int, gpu: float) -> dict[str, Any]:
    """The plan: per-GPU terms of a learner and a generator, and whether each fits."""
    c = model_shape(cfg, shape)
    learner = learner_terms(cfg, c, prompt)
    gen = generator_terms(cfg, c, prompt, gpu)
    needed = gen["weights"] + gen["kv_cache"]
    return {
        "model": shape or cfg.model.path,
        "parameters": param_counts(c)["total"],
        "learners": cfg.workers.learners,
        "generators": cfg.workers.generators,
        "shard_ranks": shard_ranks(cfg),
        "micro_batch_rows": _step_terms(cfg, c, prompt, cfg.model.lora.enabled)["rows"],
        "gpu_bytes": int(gpu * GIB),
        "learner": learner,
        "learner_total": sum(learner.values()),
        "generator": gen,
        # vLLM fails at start when its reservation cannot hold the weights and the cache
        "generator_total": max(gen["reserved"], needed),
        "generator_needed": needed,
    }


def fits(p: dict[str, Any]) -> bool:
    gpu = p["gpu_bytes"]
    return (
        p["learner_total"] <= gpu
        and p["generator_total"] <= gpu
        and (p["generator_needed"] <= p["generator"]["reserved"])
    )


def format_plan(p: dict[str, Any]) -> str:
    """A Markdown table of the plan, GiB per GPU."""
    g = p["generator"]
    lines = [
        f"plan (not a measurement): {p['model']}, {p['parameters'] / 1e9:.2f}B parameters, "
        f"{p['learners']} learner GPU(s) (policy split over {p['shard_ranks']}), "
        f"{p['generators']} generator GPU(s), {p['micro_batch_rows']} rows per micro-batch",
        "",
        "| GPU | term | GiB |",
        "|---|---|---|",
    ]
    for term, value in p["learner"].items():
        lines.append(f"| learner | {term} | {value / GIB:,.2f} |")
    lines.append(f"| learner | **total** | **{p['learner_total'] / GIB:,.2f}** |")
    lines.append(f"| generator | vLLM reservation | {g['reserved'] / GIB:,.2f} |")
    lines.append(f"| generator | of which weights (bf16) | {g['weights'] / GIB:,.2f} |")
    lines.append(
        f"| generator | of which KV cache ({g['rows']} rows x {g['tokens']} tokens) | "
        f"{g['kv_cache'] / GIB:,.2f} |"
    )
    lines.append(f"| generator | **total** | **{p['generator_total'] / GIB:,.2f}** |")
    verdict = "fits" if fits(p) else "does NOT fit"
    lines += ["", f"{verdict} on {p['gpu_bytes'] / GIB:g} GiB GPUs"]
    if p["generator_needed"] > g["reserved"]:
        lines.append(
            f"vLLM needs {p['generator_needed'] / GIB:,.2f} GiB (weights + KV cache) but "
            f"reserves {g['reserved'] / GIB:,.2f}: raise vllm.gpu_memory_utilization"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from replayrl.config.schema import load_config

    cfg = load_config(args.config, args.overrides)
    p = plan(cfg, args.shape, args.prompt_tokens, args.gpu_memory)
    print(json.dumps(p, indent=2) if args.json else format_plan(p))
    return 0 if fits(p) else 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan", help="per-GPU memory of a run from its config, before any GPU is touched"
    )
    p.add_argument("--config", "-c", help="a preset name or YAML file (as in `train`)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. workers.learners=4")
    p.add_argument("--shape", choices=sorted(SHAPES), help="a named model shape (else model.path)")
    p.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU (default 80)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt tokens per row")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=main)
