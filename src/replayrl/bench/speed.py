"""`replayrl bench speed`: generation and learner tokens/s, old vs new path, next to bounds.

Everything is measured in one process, side by side, as medians over repeats:
- bounds of this machine: matmul GFLOP/s (fp32 default path, fp32 through oneDNN, bf16)
  and memory bandwidth (a large copy). A decode step must read every weight once and do
  2 N FLOPs per row; a trained token costs 6 N FLOPs (4 N with LoRA: no weight gradients of
  the frozen base), N = parameters in the model's matmuls (attention over the KV cache,
  embeddings and elementwise work ignored: the bound is optimistic);
- generation: N prompts x S completions of up to T new tokens, `old` = transformers
  `generate` with output_logits (the project's path before this module), `new` = our decode
  loop (generation/hf.py; the lean Llama decoder where the model is a Llama), `fast_hf` =
  the same loop on transformers' forward and dynamic cache, in fp32 and from a bf16 copy;
- learner: one GRPO-clip training step (Learner.train_step: log-probs, loss, backward,
  optimizer) over B sequences of L tokens, full fine-tuning and LoRA, `old` = full-vocab
  logits, default fp32 matmuls, one micro-batch; `new` = completion-only chunked log-probs,
  oneDNN fp32 matmuls, micro-batch 8, and bf16 autocast;
- the behaviour / learner log-prob mismatch for each (generation, learner) precision pair;
- one GRPO step (generate prompts x completions, then train on them), old vs new; its bound
  is the generation bound for its new tokens plus the LoRA learner bound for its sequences.

Every figure is tagged with the machine (CPU model and the flags that decide bf16/fp32 speed,
threads, load average before and after): the same code runs 2-3x apart on two CPU families
so a figure without its machine says little.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from replayrl.config.schema import ModelConfig, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner import logprobs
from replayrl.learner.batching import shared_prompt_order
from replayrl.learner.learner import Learner, collate, token_logprobs, unpad
from replayrl.models import precision
from replayrl.models.loading import apply_lora
from replayrl.rollout.generation import HFGenerator, Sample, SamplingParams
from replayrl.run.policy import load_policy
from replayrl.storage.io import atomic_write_json

QUESTIONS = [
    "A train travels 120 km in 2 hours and then 90 km in 1.5 hours. What is its average speed?",
    "If 3 pencils cost 45 cents, how much do 11 pencils cost?",
    "What is the sum of the first 20 positive odd numbers?",
    "A rectangle has a perimeter of 36 cm and a width of 7 cm. What is its area?",
    "Sara has twice as many apples as Tom. Together they have 27. How many does Sara have?",
    "What is 15% of 240, plus one third of 99?",
    "A shop sells a coat for $80 after a 20% discount. What was the original price?",
    "How many minutes are there between 9:45 and 13:10?",
    "The average of five numbers is 12. Four of them are 10, 14, 9 and 15. Find the fifth.",
    "A tank holds 500 litres and leaks 12 litres per hour. How full is it after 15 hours?",
    "What is the least common multiple of 12, 18 and 30?",
    "A car uses 6 litres of fuel per 100 km. How much fuel does it need for 350 km?",
    "Tom reads 18 pages a day. How many days does he need for a 400-page book?",
    "Find x if 7x - 5 = 3x + 27.",
    "A recipe needs 250 g of flour for 4 people. How much flour is needed for 10 people?",
    "What is the remainder when 2 to the power 10 is divided by 7?",
]
SYSTEM = (
    "You are a careful math tutor. Solve the problem step by step, explain every step in "
    "plain words, check the arithmetic once more at the end, and give the final answer on "
    "its own line in the form 'Answer: <number>'. Keep the explanation short and exact."
)


@dataclass
class Row:
    section: str
    variant: str
    tokens: int
    seconds: float  # median
    bound: float | None  # tokens/s bound for this variant's precision
    extra: str = ""
    # grpo step: (generated tokens, batch, trained tokens) for its bound
    work: tuple[int, int, int] | None = None
    # median process CPU seconds: on a shared, oversubscribed machine wall time counts the
    # time other processes held the cores; CPU time (with --threads 1) is close to what a quiet
    # machine would take (memory and cache contention remain)
    cpu_seconds: float | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def pct(self) -> float | None:
        return None if not self.bound else 100.0 * self.tok_s / self.bound

    @property
    def pct_cpu(self) -> float | None:
        """% of bound by CPU time."""
        if not self.bound or not self.cpu_seconds:
            return None
        return 100.0 * self.tokens / self.cpu_seconds / self.bound


# -- bounds -------------------------------------------------------------------------------------
def _best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` runs: a bound is what the machine can do, and on a shared machine
    the median counts other processes' turns on the cores (the workloads take medians)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _gflops(dtype: torch.dtype, repeats: int) -> float:
    a = torch.randn(1024, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    a @ b  # warm-up (oneDNN builds its kernels on first use)
    inner = 5
    t = _best_time(lambda: [a @ b for _ in range(inner)], max(repeats, 7))
    return inner * 2 * 1024 * 576 * 1536 / t / 1e9


def measure_bounds(repeats: int = 3) -> dict[str, float]:
    """Matmul GFLOP/s (fp32 default, fp32 oneDNN, bf16) and copy bandwidth (GB/s), best of
    at least 7 runs each."""
    out: dict[str, float] = {}
    precision.disable_fast_fp32_matmul()
    out["gflops_fp32"] = _gflops(torch.float32, repeats)
    out["onednn_fp32_accurate"] = float(precision.enable_fast_fp32_matmul())
    out["gflops_fp32_onednn"] = _gflops(torch.float32, repeats)
    out["gflops_bf16"] = _gflops(torch.bfloat16, repeats)
    src = torch.ones(64 * 1024 * 1024)  # 256 MB
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), max(repeats, 7))
    out["bandwidth_gbs"] = 2 * src.numel() * 4 / t / 1e9  # read + write
    return out


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls per token: Linear weights plus the output head
    (tied to the embeddings in SmolLM2, so not a Linear of its own)."""
    # the head is an nn.Linear (tied or not), so it is counted here once
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def decode_bound(n_mm: int, batch: int, gflops: float, gbs: float, bytes_per: int) -> float:
    """tokens/s if each decode step only read the weights once and did 2 N FLOPs per row."""
    t_mem = n_mm * bytes_per / (gbs * 1e9)
    t_flop = 2 * n_mm * batch / (gflops * 1e9)
    return batch / max(t_mem, t_flop)


# -- workloads ----------------------------------------------------------------------------------
def _prompts(tok, n: int) -> list[str]:
    qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    if getattr(tok, "chat_template", None):
        return [
            tok.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for q in qs
        ]
    return [f"{SYSTEM}\n\nQuestion: {q}\nAnswer:" for q in qs]


def _to_rollouts(samples: list[Sample], seed: int) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    return [
        Rollout(
            prompt_ids=s.prompt_ids,
            completion_ids=s.completion_ids,
            behaviour_logprobs=s.logprobs,
            reward=float(rng.integers(0, 2)),
            advantage=float(rng.choice([-1.0, 1.0])),
            correct=False,
            group_id=s.prompt_index,
            policy_version=s.policy_version,
            step=0,
        )
        for s in samples
    ]


def random_rollouts(vocab: int, n: int, prompt_len: int, completion_len: int) -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(10, vocab, (prompt_len + completion_len,), generator=g)
        out.append(
            Rollout(
                prompt_ids=ids[:prompt_len],
                completion_ids=ids[prompt_len:],
                behaviour_logprobs=torch.full((completion_len,), -2.0),
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
                correct=False,
                group_id=i // 4,
                policy_version=0,
                step=0,
            )
        )
    return out


@dataclass(frozen=True)
class Path_:
    """One way of running: the reference path (`old`: transformers' generate and forward) or
    a fast one in some precision."""

    name: str
    old: bool
    gen_dtype: torch.dtype | None = None  # None: the weights' (fp32)
    autocast: torch.dtype | None = None
    impl: str = "fast"  # HFGenerator impl of a fast path (the reference uses `generate`)
    # learner: the lean Llama training forward (lean_forward.py) and log pi_old of fresh
    # rollouts from the first update's forward; False: transformers' forward and a separate
    # no-grad pass (a fast path without them, to measure what they save)
    lean: bool = True

    def setup(self) -> None:
        if self.old:
            precision.disable_fast_fp32_matmul()
        else:
            precision.enable_fast_fp32_matmul()


OLD = Path_("old fp32", old=True)
NEW32 = Path_("new fp32", old=False)
NEW16 = Path_("new bf16", old=False, gen_dtype=torch.bfloat16, autocast=torch.bfloat16)
# the bf16 learner before the lean training forward (BENCHMARKS.md run 4's `new bf16`)
PREV16 = Path_(
    "prev bf16", old=False, gen_dtype=torch.bfloat16, autocast=torch.bfloat16, lean=False
)
# generation only: the fast loop on transformers' forward and dynamic cache (the fast path
# before the lean Llama decoder), so that decoder's own gain is measured side by side
HF32 = Path_("fast_hf fp32", old=False, impl="fast_hf")
HF16 = Path_("fast_hf bf16", old=False, gen_dtype=torch.bfloat16, impl="fast_hf")


def _learner(
    model, pad_id: int, micro: int, extra: list[str] | None = None, path: Path_ | None = None
) -> Learner:
    """A learner as a run would build it; with `path` in a reduced precision, one that
    recomputes log pi_old of fresh rollouts itself (precision.recompute_behaviour: auto)."""
    # every path pinned: `auto` (the default) would pick bf16 on a bf16-native CPU
    bf16_learn = path is not None and path.autocast is not None
    bf16_gen = path is not None and path.gen_dtype is not None
    extra = [
        f"precision.learner_autocast={'bfloat16' if bf16_learn else 'none'}",
        f"precision.generation={'bfloat16' if bf16_gen else 'float32'}",
        *(extra or []),
    ]
    cfg = load_config(
        None,
        [
            f"train.micro_batch_size={micro}",
            "train.lr=1e-6",
            "rollout.temperature=1.0",
            *(extra or []),
        ],
    )
    learner = Learner(model, pad_id, cfg)
    learner.fuse_behaviour_recompute = path is None or path.lean
    return learner


def _train(path: Path_, learner: Learner, rollouts: list[Rollout]) -> dict[str, float]:
    rng = np.random.default_rng(0)
    device = next(learner.model.parameters()).device
    with (
        logprobs.reference_impl(path.old),
        logprobs.lean_impl(path.lean and not path.old),
        precision.autocast(path.autocast, device),
    ):
        return learner.train_step(rollouts, rng)


def lean_mismatch(model, rollouts: list[Rollout], pad_id: int) -> dict[str, float]:
    """fp32 log-probs of the lean training forward against transformers' forward on the same
    rollouts (grouped by prompt, as the learner batches them), no autocast."""
    diffs = []
    precision.enable_fast_fp32_matmul()
    ordered = [rollouts[i] for i in shared_prompt_order(rollouts)]
    with torch.no_grad():
        for start in range(0, len(ordered), 8):
            b = collate(ordered[start : start + 8], pad_id)
            with logprobs.lean_impl(True):
                lean, _ = token_logprobs(model, b, 1.0)
            with logprobs.lean_impl(False):
                ref, _ = token_logprobs(model, b, 1.0)
            diffs.append((lean - ref)[b.mask.bool()].abs())
    d = torch.cat(diffs)
    return {"tokens": int(d.numel()), "mean_abs": float(d.mean()), "max_abs": float(d.max())}


CPU_SECONDS: dict[str, float] = {}  # path name -> median CPU seconds of its last _interleaved


def _interleaved(
    paths: list[Path_], runs: list[Callable[[], object]], repeats: int
) -> list[tuple[float, object]]:
    """Median seconds (and last result) of each path's run, the paths taking turns within
    every repeat so that a change in the machine's load hits them all alike; each path's
    median process CPU seconds go to CPU_SECONDS."""
    times: list[list[float]] = [[] for _ in paths]
    cpu: list[list[float]] = [[] for _ in paths]
    last: list[object] = [None] * len(paths)
    for _ in range(repeats):
        for i, (p, run) in enumerate(zip(paths, runs, strict=True)):
            p.setup()
            t0, c0 = time.perf_counter(), time.process_time()
            last[i] = run()
            times[i].append(time.perf_counter() - t0)
            cpu[i].append(time.process_time() - c0)
    for p, c in zip(paths, cpu, strict=True):
        CPU_SECONDS[p.name] = statistics.median(c)
    return [(statistics.median(t), x) for t, x in zip(times, last, strict=True)]


def bench_generation(
    model, tok, paths: list[Path_], prompts: int, samples: list[int], max_new: int, repeats: int
) -> tuple[list[Row], dict[str, list[Sample]]]:
    rows, kept = [], {}
    texts = _prompts(tok, prompts)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    all_paths = paths
    for s in samples:
        # the fast_hf rows (the decode loop on transformers' forward) at the first batch size
        # only: they measure the lean decoder's own gain, and cost a third of the time
        paths = [p for p in all_paths if s == samples[0] or p.impl != "fast_hf"]
        gens = []
        for p in paths:
            p.setup()
            gen = HFGenerator(
                model, tok, 256, impl="generate" if p.old else p.impl, dtype=p.gen_dtype
            )
            gen.generate(texts[:2], 1, SamplingParams(max_new_tokens=4))  # warm-up
            gens.append(gen)
        counts: list[list[int]] = [[] for _ in paths]

        def make_run(gen, c, s=s):
            def run():
                out = gen.generate(texts, s, params)
                c.append(sum(x.completion_ids.numel() for x in out))
                return out

            return run

        torch.manual_seed(0)
        runs = [make_run(g, c) for g, c in zip(gens, counts, strict=True)]
        for p, c, (seconds, out) in zip(
            paths, counts, _interleaved(paths, runs, repeats), strict=True
        ):
            kept[f"{p.name} x{s}"] = out
            # tokens generated differ run to run (EOS): tokens/s = median tokens / median time
            tokens = int(statistics.median(c))
            rows.append(
                Row(
                    "generation",
                    f"{p.name}, {prompts}x{s}",
                    tokens,
                    seconds,
                    None,
                    f"b{prompts * s}",
                    cpu_seconds=CPU_SECONDS[p.name],
                )
            )
    return rows, kept


def measure_mismatch(
    model, tok, samples: dict[str, list[Sample]], pad_id: int
) -> list[dict[str, object]]:
    """|behaviour - learner| log-prob per (generation, learner) precision pair."""
    out = []
    precision.enable_fast_fp32_matmul()
    for gen_name, gen_key in (("fp32", "new fp32 x1"), ("bf16", "new bf16 x1")):
        if gen_key not in samples:
            continue
        rollouts = _to_rollouts(samples[gen_key], 0)
        for learn_name, ac in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
            diffs = []
            for start in range(0, len(rollouts), 8):
                b = collate(rollouts[start : start + 8], pad_id)
                with torch.no_grad():
                    lp, _ = token_logprobs(model, b, 1.0, autocast=ac)
                diffs.extend(d.abs() for d in unpad(lp - b.old_logprobs, b.mask))
            d = torch.cat(diffs)
            outside = ((d.exp() > 1.2) | ((-d).exp() < 0.8)).float().mean()
            out.append(
                {
                    "generation": gen_name,
                    "learner": learn_name,
                    "tokens": int(d.numel()),
                    "mean_abs": float(d.mean()),
                    "max_abs": float(d.max()),
                    "ratio_outside_0.8_1.2": float(outside),
                }
            )
    return out


def bench_learner(
    model, pad_id: int, paths: list[Path_], seqs: int, seq_len: int, lora: bool, repeats: int
) -> list[Row]:
    prompt_len = seq_len - seq_len * 16 // 25  # 200 -> 72 prompt + 128 completion
    vocab = int(model.get_input_embeddings().weight.shape[0])
    rollouts = random_rollouts(vocab, seqs, prompt_len, seq_len - prompt_len)
    learners = []
    for p in paths:
        p.setup()
        policy = copy.deepcopy(model)
        if lora:
            policy = apply_lora(policy, ModelConfig.model_validate({"lora": {"enabled": True}}))
        learner = _learner(policy, pad_id, micro=64 if p.old else 8)
        learner.fuse_behaviour_recompute = p.lean
        _train(p, learner, rollouts[:2])  # warm-up
        learners.append(learner)
    runs = [
        lambda p=p, lr=lr: _train(p, lr, rollouts) for p, lr in zip(paths, learners, strict=True)
    ]
    kind = "LoRA" if lora else "full"
    timed = _interleaved(paths, runs, repeats)
    return [
        Row(
            "learner", f"{p.name}, {kind}", seqs * seq_len, t, None, kind, None, CPU_SECONDS[p.name]
        )
        for p, (t, _) in zip(paths, timed, strict=True)
    ]


def bench_grpo_step(
    model,
    tok,
    pad_id: int,
    paths: list[Path_],
    prompts: int,
    group: int,
    max_new: int,
    repeats: int,
) -> tuple[list[Row], dict[str, float]]:
    """Generate prompts x group completions, then one LoRA train step on them; also the lean
    forward's fp32 log-prob difference from transformers' forward on those rollouts."""
    texts = _prompts(tok, prompts)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    runs, stats, learners = [], [], []
    for p in paths:
        p.setup()
        policy = apply_lora(
            copy.deepcopy(model), ModelConfig.model_validate({"lora": {"enabled": True}})
        )
        core = policy.get_base_model()
        gen = HFGenerator(core, tok, 256, impl="generate" if p.old else "fast", dtype=p.gen_dtype)
        # micro-batch 8 on both paths, as configs/smollm2-gsm.yaml: the old path's full-vocab
        # logits over 64 rollouts in one micro-batch took 22 GB and were OOM-killed here
        learner = _learner(policy, pad_id, micro=8, path=p)
        st: dict[str, list] = {"gen": [], "train": [], "tokens": [], "trained": [], "rollouts": []}
        stats.append(st)
        learners.append(learner)

        def step(p=p, gen=gen, learner=learner, st=st):
            t0 = time.perf_counter()
            samples = gen.generate(texts, group, params)
            t1 = time.perf_counter()
            rollouts = _to_rollouts(samples, len(st["gen"]))
            # reduced precision: the learner recomputes log pi_old of the fresh rollouts (a
            # separate pass, or on the lean path the first update's own forward)
            _train(p, learner, rollouts)
            st["rollouts"] = rollouts
            gen.policy_version = learner.version
            st["gen"].append(t1 - t0)
            st["train"].append(time.perf_counter() - t1)
            st["tokens"].append(sum(r.completion_ids.numel() for r in rollouts))
            st["trained"].append(
                sum(r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts)
            )

        runs.append(step)
    torch.manual_seed(0)
    rows = []
    for p, st, (seconds, _) in zip(paths, stats, _interleaved(paths, runs, repeats), strict=True):
        extra = (
            f"gen {statistics.median(st['gen']):.1f} s + train "
            f"{statistics.median(st['train']):.1f} s, {statistics.median(st['tokens']):.0f} "
            "new tokens"
        )
        new_tokens = int(statistics.median(st["tokens"]))
        work = (new_tokens, prompts * group, int(statistics.median(st["trained"])))
        variant = f"{p.name}, LoRA {prompts}x{group}"
        cpu_s = CPU_SECONDS[p.name]
        rows.append(Row("grpo step", variant, new_tokens, seconds, None, extra, work, cpu_s))
    lean: dict[str, float] = {}
    if NEW32 in paths:  # the lean forward's fp32 log-probs on real rollouts, 4 prompts
        i = paths.index(NEW32)
        lean = lean_mismatch(learners[i].model, stats[i]["rollouts"][: 4 * group], pad_id)
    return rows, lean


def learner_bound(n_mm: int, gflops: float, lora_n: int | None) -> float:
    """Trained tokens/s at `gflops`: 6 N FLOPs a token (forward 2 N, backward 4 N), 4 N + 6 n
    with LoRA (no weight gradients of the frozen base; n = adapter parameters)."""
    per_token = 6 * n_mm if lora_n is None else 4 * n_mm + 6 * lora_n
    return gflops * 1e9 / per_token


def grpo_bound(
    n_mm: int, work: tuple[int, int, int], gflops: float, gbs: float, bytes_per: int, lora_n: int
) -> float:
    """A GRPO step's bound in generated tokens/s: the step's time at the bounds is generating
    its new tokens at the decode bound of its batch plus training its sequences (prompt +
    completion tokens) at the LoRA learner bound."""
    new_tokens, batch, trained = work
    t = new_tokens / decode_bound(n_mm, batch, gflops, gbs, bytes_per)
    t += trained / learner_bound(n_mm, gflops, lora_n)
    return new_tokens / t


def _with_bounds(rows: list[Row], bounds: dict[str, float], model, lora_n: int) -> None:
    n_mm = matmul_params(model)
    gbs = bounds["bandwidth_gbs"]
    for r in rows:
        bf16 = "bf16" in r.variant
        old = r.variant.startswith("old")
        flops = bounds["gflops_bf16" if bf16 else "gflops_fp32" if old else "gflops_fp32_onednn"]
        if r.section == "generation":
            batch = int(r.extra[1:])
            r.bound = decode_bound(n_mm, batch, flops, gbs, 2 if bf16 else 4)
        elif r.section == "learner":
            r.bound = learner_bound(n_mm, flops, lora_n if r.extra == "LoRA" else None)
        elif r.section == "grpo step" and r.work is not None:
            r.bound = grpo_bound(n_mm, r.work, flops, gbs, 2 if bf16 else 4, lora_n)


def machine_info(threads: int) -> dict[str, object]:
    """What a speed figure depends on: CPU model and its bf16/fp32-relevant flags, threads,
    torch version, and what `precision: auto` picks here (a figure is only comparable with
    figures of the same machine)."""
    cpu = precision.cpu_info()
    hw = precision.hardware_check()
    return {
        "cpu": cpu["model"],
        "flags": cpu["flags"],
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "bf16_native": hw.native,
        "auto_precision": ("bf16" if hw.native else "fp32") + f" ({hw.reason})",
    }


def format_header(machine: dict[str, object], bounds: dict[str, float]) -> str:
    """One line naming the machine, its load and its measured bounds, above the table."""
    load = machine.get("loadavg_start"), machine.get("loadavg_end")
    flags = ", ".join(machine["flags"]) or "none"  # type: ignore[arg-type]
    return (
        f"Machine: {machine['cpu']} ({flags}); {machine['threads']} threads of "
        f"{machine['cores']} cores; torch {machine['torch']}; load average (1 min) "
        f"{load[0]} at start, {load[1]} at end; bounds: fp32 {bounds['gflops_fp32']:.1f} "
        f"GFLOP/s (oneDNN {bounds['gflops_fp32_onednn']:.1f}), bf16 "
        f"{bounds['gflops_bf16']:.1f} GFLOP/s, copy {bounds['bandwidth_gbs']:.1f} GB/s; "
        f"precision auto here: {machine['auto_precision']}"
    )


def format_table(rows: list[Row]) -> str:
    base: dict[tuple[str, str], float] = {}
    lines = [
        "| section | variant | tokens | median s | CPU s | tok/s | bound tok/s | % of bound "
        "| % of bound by CPU s | vs old |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        key = (r.section, r.variant.split(", ", 1)[-1])
        if r.variant.startswith("old"):
            base[key] = r.seconds
        old = base.get(key)
        speed = f"{old / r.seconds:.2f}x" if old else ""
        bound = f"{r.bound:,.0f}" if r.bound else ""
        pct = f"{r.pct:.0f}%" if r.pct is not None else ""
        pct_cpu = f"{r.pct_cpu:.0f}%" if r.pct_cpu is not None else ""
        cpu = f"{r.cpu_seconds:.2f}" if r.cpu_seconds is not None else ""
        grpo = r.section == "grpo step"
        tokens, secs = (r.extra, f"{r.seconds:.1f}") if grpo else (r.tokens, f"{r.seconds:.2f}")
        lines.append(
            f"| {r.section} | {r.variant} | {tokens} | {secs} | {cpu} | {r.tok_s:,.0f} | "
            f"{bound} | {pct} | {pct_cpu} | {speed} |"
        )
    return "\n".join(lines)


def run_speed_bench(
    model_path: str,
    *,
    threads: int = 2,
    repeats: int = 3,
    prompts: int = 16,
    samples: tuple[int, ...] = (1,),
    max_new: int = 128,
    seqs: int = 16,
    seq_len: int = 200,
    group: int = 4,
    grpo_repeats: int = 1,
    sections: tuple[str, ...] = ("generation", "learner", "grpo"),
    prev: bool = False,
    out: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, object]:
    torch.set_num_threads(threads)
    cfg = load_config(None, [f"model.path={model_path}"])
    model, tok, path = load_policy(cfg.model, cfg.task, log=log)
    model.eval()
    pad_id = tok.pad_token_id
    # PREV16 (bf16 before the lean training forward) is measured only when asked for
    paths = [OLD, NEW32, PREV16, NEW16] if prev else [OLD, NEW32, NEW16]
    machine = machine_info(threads)
    machine["loadavg_start"] = round(os.getloadavg()[0], 2)
    log(f"bench speed: {path}, {threads} threads, medians of {repeats}")
    log(f"machine: {machine['cpu']}; flags {machine['flags']}; auto: {machine['auto_precision']}")
    bounds = measure_bounds(repeats)
    log("bounds: " + ", ".join(f"{k} {v:,.1f}" for k, v in bounds.items()))
    rows: list[Row] = []
    mismatch: list[dict[str, object]] = []
    lean: dict[str, float] = {}
    if "generation" in sections:
        gen_paths = [OLD, HF32, NEW32, HF16, NEW16]
        gen_rows, kept = bench_generation(
            model, tok, gen_paths, prompts, list(samples), max_new, repeats
        )
        rows += gen_rows
        log(format_table(rows))
        mismatch = measure_mismatch(model, tok, kept, pad_id)
    if "learner" in sections:
        for lora in (False, True):
            rows += bench_learner(model, pad_id, paths, seqs, seq_len, lora, repeats)
            log(format_table(rows))
    if "grpo" in sections:
        grpo_rows, lean = bench_grpo_step(
            model, tok, pad_id, paths, prompts, group, max_new, grpo_repeats
        )
        rows += grpo_rows
    lora_policy = apply_lora(
        copy.deepcopy(model), ModelConfig.model_validate({"lora": {"enabled": True}})
    )
    lora_n = sum(p.numel() for p in lora_policy.parameters() if p.requires_grad)
    _with_bounds(rows, bounds, model, lora_n)
    machine["loadavg_end"] = round(os.getloadavg()[0], 2)
    result = {
        "model": path,
        "machine": machine,
        "threads": threads,
        "repeats": repeats,
        "torch": torch.__version__,
        "bounds": bounds,
        "rows": [
            {**r.__dict__, "tok_s": r.tok_s, "pct_of_bound": r.pct, "pct_of_bound_cpu": r.pct_cpu}
            for r in rows
        ],
        "mismatch": mismatch,
        "lean_vs_transformers_fp32": lean,
        "table": format_header(machine, bounds) + "\n\n" + format_table(rows),
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, result)
    return result


def format_mismatch(rows: list[dict[str, object]]) -> str:
    lines = [
        "| generation | learner | tokens | mean abs diff | max abs diff "
        "| ratio outside [0.8, 1.2] |",
        "|---|---|---|---|---|---|",
    ]
    for m in rows:
        lines.append(
            f"| {m['generation']} | {m['learner']} | {m['tokens']} | {m['mean_abs']:.2e} | "
            f"{m['max_abs']:.2e} | {100 * float(m['ratio_outside_0.8_1.2']):.2f}% |"
        )
    return "\n".join(lines)


def bench_weight_sync(model_path: str, threads: int, repeats: int) -> dict[str, object]:
    """Bytes and seconds per weight sync, object store vs broadcast (gloo here, NCCL between
    GPUs), in the generation dtype `precision: auto` picks (and in fp32)."""
    from replayrl.config.schema import load_config
    from replayrl.models.precision import choose_for
    from replayrl.run.distributed.broadcast import weight_sync_figures
    from replayrl.run.policy import load_policy

    torch.set_num_threads(threads)
    cfg = load_config(None, [f"model.path={model_path}"] if model_path != "tiny" else [])
    model, _, _ = load_policy(cfg.model, cfg.task, log=lambda _: None)
    gen = choose_for(cfg.precision, model).generation or torch.float32
    dtypes = dict.fromkeys([gen, torch.float32])
    return {"model": model_path, "rows": [weight_sync_figures(model, d, repeats) for d in dtypes]}


def format_weight_sync(result: dict) -> str:
    lines = [f"weight sync of {result['model']}: bytes and seconds per sync, one generator"]
    for row in result["rows"]:
        for path, fig in row.items():
            if path != "dtype":
                mb = fig["bytes"] / 2**20
                lines.append(
                    f"  {row['dtype']:9s} {path:16s} {mb:9.1f} MiB  {fig['seconds']:.4f} s"
                )
    return "\n".join(lines)


def main(args) -> int:
    """`replayrl bench speed` (arguments parsed by cli/main.py)."""
    sections = tuple(args.sections or ("generation", "learner", "grpo"))
    unknown = set(sections) - {"generation", "learner", "grpo", "weight_sync"}
    if unknown:
        raise ValueError(f"bench speed --sections: unknown {sorted(unknown)}")
    if "weight_sync" in sections:
        print(format_weight_sync(bench_weight_sync(args.model, args.threads, args.repeats or 3)))
        sections = tuple(s for s in sections if s != "weight_sync")
        if not sections:
            return 0
    result = run_speed_bench(
        args.model,
        threads=args.threads,
        repeats=args.repeats or 3,
        samples=tuple(getattr(args, "samples", None) or (1, 4)),
        sections=sections,
        out=Path(args.json) if args.json else None,
    )
    print(result["table"])
    if result["lean_vs_transformers_fp32"]:
        print(
            f"lean vs transformers forward, fp32 log-probs: {result['lean_vs_transformers_fp32']}"
        )
    if result["mismatch"]:
        print()
        print(format_mismatch(result["mismatch"]))  # type: ignore[arg-type]
    return 0
