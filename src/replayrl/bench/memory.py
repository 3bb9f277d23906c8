"""`replayrl bench memory`: peak memory of one learner step (full fine-tuning and LoRA), of
the output head alone, and of one generation step, for models built from a config with
random weights (nothing is downloaded), beside a stated formula.

Each measurement runs in a fresh subprocess. On CPU the figure is the growth of the resident
set: the kernel's peak-RSS counter (VmHWM) is reset through /proc/self/clear_refs just
before the measured work and read after it, minus the RSS before the model was built
(`total`) or just before the work (`head`, `lm-head`). On CUDA it is torch.cuda.max_memory_allocated
(reset the same way). The formula (bytes, fp32):

    weights + grads + optimizer (AdamW: 2 x trainable) + activations + head

- activations, per token and layer: 7 hidden + 2 kv + 4 intermediate floats (what the lean
  forward keeps for backward: two RMSNorm input/output pairs, q, k, v and the attention
  output, the o_proj input, and four MLP tensors); with checkpointing, one hidden state per
  layer plus one layer's full activations while it is recomputed;
- head: two vocab x hidden temporaries (the head's and the tied embedding's weight-gradient
  contributions before they are summed), three fp32 tensors of `chunk rows` x vocab (logits,
  softmax, their gradient), whatever the number of rows, since backward recomputes each
  chunk's logits (learner/logprobs.py), and three tokens x hidden tensors (the final states,
  the norm's input, their gradient);
- lm-head: the head's function alone (learner/logprobs.py `head_logprobs`, chunked, backward
  recomputing each chunk) on given final states of every completion token: one vocab x
  hidden weight-gradient temporary and the gradient itself, the three chunk x vocab fp32
  tensors, and the states' gradient (tokens x hidden); the states themselves are inputs,
  allocated before the baseline;
- generation: weights + KV cache (2 x layers x kv x rows x length) + a few rows x vocab logits.

With `--ranks N` (N >= 2) each measurement runs on N processes joined over gloo (CPU) or NCCL,
the model sharded with FSDP2 as sharded learners shard it (run/distributed/fsdp.py: a group per
decoder layer, the root group, gradient checkpointing on, the chunked head); each rank
measures its own peak and the row shows the largest. The formula describes one unsharded
process and is printed beside sharded rows only as a reference.

The model configs are SmolLM2-135M's LlamaConfig values and Qwen2.5-0.5B's shapes (vocabulary
151,936) on the Llama architecture with attention biases, so that both take the lean forward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used: the CLI's parser stays quick
    import torch

    from replayrl.learner.batching import TrainBatch

# transformers LlamaConfig values of HuggingFaceTB/SmolLM2-135M
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
# Qwen2.5-0.5B's shapes on the Llama architecture (the lean forward's), with q/k/v/o biases
QWEN25_05B_SHAPED: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": True,
}
# Qwen2.5-1.5B's and Qwen2.5-7B's public config.json shapes (for `replayrl plan`; too large to
# measure on CPU); 7B does not tie its output head to the embedding
QWEN25_15B_SHAPED: dict[str, Any] = {
    **QWEN25_05B_SHAPED,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
}
QWEN25_7B_SHAPED: dict[str, Any] = {
    **QWEN25_05B_SHAPED,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
CONFIGS = {"smollm2-135m": SMOLLM2_135M, "qwen2.5-0.5b": QWEN25_05B_SHAPED}
# shapes `replayrl plan` knows by name (the measured ones and the larger Qwen2.5 models)
SHAPES = {**CONFIGS, "qwen2.5-1.5b": QWEN25_15B_SHAPED, "qwen2.5-7b": QWEN25_7B_SHAPED}
KINDS = ("head", "lm-head", "full", "lora", "generation")
_PROMPT = 64
_GEN_TOKENS = 16
_MB = 1 << 20


def _status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak(cuda: bool) -> int:
    """Start a peak measurement; returns the current figure (the baseline)."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    return _status("VmRSS")


def _peak(cuda: bool) -> int:
    import torch

    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status("VmHWM")


def build_model(name: str, layers: int | None, device: str) -> torch.nn.Module:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    values = dict(CONFIGS[name])
    if layers is not None:
        values["num_hidden_layers"] = layers
    torch.manual_seed(0)
    model: torch.nn.Module = LlamaForCausalLM(LlamaConfig(**values))
    model.to(torch.device(device))
    return model


def make_batch(vocab: int, rows: int, tokens: int, device: str) -> TrainBatch:
    """A collated batch of `rows` distinct 64-token prompts with `tokens` completion tokens."""
    from replayrl.bench.speed import random_rollouts
    from replayrl.learner.learner import collate

    batch = collate(random_rollouts(vocab, rows, _PROMPT, tokens), 0)
    return batch.to(device)


def _learner_step(model, batch, lora: bool) -> None:
    """Policy log-probs, a policy-gradient loss (with the LoRA reference's KL), backward and
    one AdamW step: the memory of a learner micro-batch."""
    import torch

    from replayrl.learner.frozen import AdaptersDisabled
    from replayrl.learner.logprobs import token_logprobs

    mask = batch.mask
    adv = torch.where(torch.arange(mask.shape[0], device=mask.device) % 2 == 1, 1.0, -1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    logps, _ = token_logprobs(model, batch, 1.0)
    loss = -(adv[:, None] * logps * mask).sum() / mask.sum()
    if lora:  # the KL reference: the same module with its adapters switched off
        with torch.no_grad():
            ref, _ = token_logprobs(AdaptersDisabled(model), batch, 1.0)
        loss = loss + 0.01 * ((logps - ref) * mask).sum() / mask.sum()
    loss.backward()
    opt.step()


def _shard(model: torch.nn.Module, spec: dict[str, Any]) -> None:
    """Join the ranks' group and shard `model` as a sharded learner does (in place)."""
    import torch

    from replayrl.learner import logprobs
    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group

    device = torch.device(spec["device"])
    init_group(spec["rank"], spec["ranks"], "127.0.0.1", spec["port"], device=device)
    model.gradient_checkpointing_enable(  # type: ignore[operator]
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    logprobs.prepare(model)
    mesh = fsdp.make_mesh(spec["ranks"], 1, device)
    fsdp.shard_policy(model, mesh, fsdp.param_dtype(spec.get("param_dtype", "auto"), device))


def _probe_model(spec: dict[str, Any], layers: int, device: str, sharded: bool) -> Any:
    """The measured model: random weights of `spec["model"]`'s shape, with LoRA adapters
    (kind lora), gradient checkpointing and sharding as the spec asks."""
    model = build_model(spec["model"], layers, device)
    if spec["kind"] == "lora":
        from replayrl.config.schema import LoraConfig, ModelConfig
        from replayrl.models.loading import apply_lora

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        cfg = ModelConfig(lora=LoraConfig(enabled=True, r=16, target_modules=targets))
        model = apply_lora(model, cfg)  # type: ignore[arg-type]
    if spec.get("checkpointing"):
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    if sharded:
        if spec["kind"] not in ("head", "full", "lora"):
            raise ValueError(f"--ranks: kind {spec['kind']} is not measured sharded")
        _shard(model, spec)
    return model


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement (in this process): spec has model, kind, layers, rows, tokens,
    checkpointing, device; with `ranks` >= 2 also rank and port (this process is one rank of
    a sharded model)."""
    import torch

    device = spec["device"]
    sharded = spec.get("ranks", 1) > 1
    cuda = device.startswith("cuda")
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    # imports first: the modules' own memory is not the step's
    import transformers  # noqa: F401

    import replayrl.learner.learner  # noqa: F401
    import replayrl.learner.logprobs  # noqa: F401
    import replayrl.models.loading  # noqa: F401

    if spec["kind"] == "lora":
        import peft  # noqa: F401
    start = _reset_peak(cuda)
    # a sharded head probe keeps one decoder layer: a group of its own beside the root's
    layers = (1 if sharded else 0) if spec["kind"] in ("head", "lm-head") else spec["layers"]
    model = _probe_model(spec, layers, device, sharded)
    vocab = CONFIGS[spec["model"]]["vocab_size"]
    tokens = spec["tokens"]
    t0 = time.perf_counter()
    if spec["kind"] == "generation":
        batch = make_batch(vocab, spec["rows"], _GEN_TOKENS, device)
        ids = batch.input_ids[:, :_PROMPT]
        model.eval()
        base = _reset_peak(cuda)
        with torch.no_grad():
            model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=True,
                pad_token_id=0,
            )
    else:
        batch = make_batch(vocab, spec["rows"], tokens, device)
        model.train()
        if sharded:
            torch.distributed.barrier()
        base = _reset_peak(cuda)
        if spec["kind"] == "lm-head":  # the head's function alone, on given final states
            from replayrl.learner.logprobs import head_logprobs

            sel = batch.mask.bool()
            states = torch.randn(int(sel.sum()), CONFIGS[spec["model"]]["hidden_size"])
            states = states.to(device).requires_grad_(True)
            base = _reset_peak(cuda)
            logps, _ = head_logprobs(states, model.lm_head, batch, sel, 1.0, False)
            (logps * batch.mask).sum().backward()
        elif spec["kind"] == "head":  # embedding + final norm + head: the head's own memory
            from replayrl.learner.logprobs import token_logprobs

            full = spec.get("logprobs") == "full"  # the full-logits path, for comparison
            logps, _ = token_logprobs(model, batch, 1.0, full=full)
            (logps * batch.mask).sum().backward()
        else:
            _learner_step(model, batch, spec["kind"] == "lora")
    peak = _peak(cuda)
    if sharded:
        from replayrl.run.distributed.ddp import leave_group

        leave_group()
    return {
        **spec,
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_total": peak - start,
        "peak_step": peak - base,
        "counter": "torch.cuda.max_memory_allocated" if cuda else "VmHWM - VmRSS",
    }


def formula(spec: dict[str, Any], chunk_elements: int = 1 << 25) -> dict[str, int]:
    """The predicted peak in bytes by term (module docstring). `spec["config"]`, when given, is
    the model's config values (`replayrl plan`), else `CONFIGS[spec["model"]]`; `spec["prompt"]`
    the prompt tokens per row (default 64, what the measurements use)."""
    c = dict(spec.get("config") or CONFIGS[spec["model"]])
    layers = 0 if spec["kind"] in ("head", "lm-head") else spec["layers"]
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    per_layer = 4 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
    n_params = v * h + layers * per_layer + h
    chunk = max(16, chunk_elements // v)
    rows, tokens = spec["rows"], spec["tokens"]
    prompt = spec.get("prompt", _PROMPT)
    if spec["kind"] == "generation":
        seq = prompt + tokens
        kv_cache = 2 * layers * kv * rows * seq * 4
        return {"weights": 4 * n_params, "kv_cache": kv_cache, "logits": 3 * rows * v * 4}
    n_tok = rows * (tokens - 1)  # completion tokens that predict a used token
    seq_tok = rows * (prompt + tokens - 1)
    if spec["kind"] == "lora":  # r = 16 on all seven projections: r x (in + out) each
        trainable = layers * 16 * (9 * h + 2 * kv + 3 * inter)
    else:
        trainable = n_params
    act_full = (7 * h + 2 * kv + 4 * inter) * 4
    if spec.get("checkpointing") and layers:
        acts = layers * seq_tok * h * 4 + seq_tok * act_full
    else:
        acts = layers * seq_tok * act_full
    # the head's and the tied embedding's weight-gradient contributions before they are
    # summed into the gradient, and one chunk's fp32 logits, softmax and their gradient
    head = 2 * v * h * 4 + 3 * min(chunk, n_tok) * v * 4 + n_tok * h * 4 * 3
    if spec["kind"] == "lm-head":
        return {
            "weight_grad": 2 * v * h * 4,
            "chunk": 3 * min(chunk, n_tok) * v * 4,
            "states_grad": n_tok * h * 4,
        }
    out = {
        "weights": 4 * n_params,
        "grads": 4 * trainable,
        "optimizer": 8 * trainable,
        "activations": acts,
        "head": head,
    }
    if spec["kind"] == "head":  # no optimizer; weights are built before the baseline
        out["weights"] = out["optimizer"] = 0
    return out


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """`measure(spec)` in a fresh interpreter (peaks of earlier work do not count); with
    `ranks` >= 2, in that many, one per rank: the largest rank's figures, each rank's peak
    in `rank_peaks`."""
    ranks = spec.get("ranks", 1)
    if ranks <= 1:
        return _child(spec)[0]
    from replayrl.run.distributed.ddp import free_port

    port = free_port()
    results = _child(*[{**spec, "rank": r, "port": port} for r in range(ranks)])
    top = max(results, key=lambda r: r["peak_total"])
    return {**top, "rank_peaks": [r["peak_step"] for r in results]}


def _child(*specs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each spec measured in a fresh interpreter, all at once (the ranks of one group)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "replayrl.bench.memory", "--child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for spec in specs
    ]
    outs = [p.communicate() for p in procs]
    for spec, p, (_, err) in zip(specs, procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"measurement {spec} failed:\n{err[-2000:]}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _row(r: dict[str, Any]) -> str:
    terms = formula(r)
    predicted = sum(terms.values())
    measured = r["peak_step"] if r["kind"] in ("head", "lm-head") else r["peak_total"]
    ranks = r.get("ranks", 1)
    ckpt = "yes" if r.get("checkpointing") or ranks > 1 else "no"
    head = r["kind"] in ("head", "lm-head")
    layers = (1 if ranks > 1 else 0) if head else r["layers"]
    return (
        f"| {r['model']} | {r['kind']} | {ranks} | {layers} | "
        f"{r['rows']} | {r['tokens']} | {ckpt} | {measured / _MB:,.0f} | "
        f"{predicted / _MB:,.0f} | {measured / max(predicted, 1):.2f} | {r['seconds']} |"
    )


HEADER = (
    "| model config | measured | ranks | layers | rows | tokens | checkpointing | peak MiB "
    "(largest rank) | formula MiB (1 process) | peak / formula | seconds |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(args: argparse.Namespace) -> int:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    print(HEADER, flush=True)
    for kind in args.kinds:
        for rows in args.rows:
            spec = {
                "model": args.model,
                "kind": kind,
                "layers": args.layers,
                "rows": rows,
                "tokens": args.tokens if kind != "generation" else args.gen_tokens,
                "checkpointing": args.checkpointing,
                "device": device,
                "threads": args.threads,
                "ranks": args.ranks,
                "param_dtype": args.param_dtype,
                "logprobs": args.logprobs,
            }
            r = run_one(spec)
            r["formula"] = formula(r)
            results.append(r)
            print(_row(r), flush=True)
    if args.json:
        from replayrl.storage.io import atomic_write_json

        atomic_write_json(args.json, results)
    return 0


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("memory", help="peak memory of a learner / generation step vs formula")
    p.add_argument("--model", choices=sorted(CONFIGS), default="smollm2-135m")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (random weights)")
    p.add_argument("--tokens", type=int, default=1024, help="completion tokens per row")
    p.add_argument("--gen-tokens", type=int, default=_GEN_TOKENS, help="generated tokens")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="micro-batch rows")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, help="torch threads")
    p.add_argument("--ranks", type=int, default=1, help="sharded (FSDP2) over this many processes")
    p.add_argument(
        "--param-dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="with --ranks: the dtype sharded parameters are gathered in (auto: bf16 on CUDA)",
    )
    p.add_argument(
        "--logprobs",
        choices=["chunked", "full"],
        default="chunked",
        help="head kind: the chunked head (the learners') or full logits (for comparison)",
    )
    p.add_argument("--json", help="write the figures to this JSON file")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(json.loads(sys.argv[2]))))
    else:
        parser = argparse.ArgumentParser(prog="replayrl bench memory")
        add_parser(parser.add_subparsers(dest="cmd", required=True))
        sys.exit(main(parser.parse_args(["memory", *sys.argv[1:]])))
