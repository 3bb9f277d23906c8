"""Will the learner fit? `replayrl train` and `ReplayTrainer.train` ask before any weights
reach a GPU: `replayrl plan`'s per-GPU learner estimate (bench/plan.py) against the free
memory of the GPU(s) the learners will use. A run that does not fit is refused
(`train.preflight=error`, the default) with the estimate, the memory available and the
single changes that the plan says would fit; `warn` logs the same and starts; `off` skips.

What is checked: the learner GPU, with the share a vLLM engine in the same process reserves
on it (a backend that runs only on a GPU, in a lockstep runtime: `vllm.gpu_memory_utilization`
x the GPU's memory, which vLLM takes whole at start), at the plan's prompt length
(`vllm.max_model_len - rollout.max_new_tokens` when set, else the plan's default of 256
tokens). Not checked (a debug note says why): CPU runs, the built-in tiny model and models
without a local config.json. Free memory is read by `torch.cuda.mem_get_info` in a short child
process, so the run's own process creates no CUDA context before it forks or hands GPUs to
Ray; with runtime=ray every GPU this machine sees is read and the smallest counts (one learner
rank per GPU). The estimate itself is a plan, not a measurement (BENCHMARKS.md's learner-memory
section lists how close it came).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from replayrl.bench.plan import GIB, learner_terms, micro_rows, model_shape
from replayrl.config.registries import BACKENDS, RUNTIMES
from replayrl.config.schema import Config
from replayrl.errors import RunDoesNotFit
from replayrl.rollout.generation.vllm_settings import vllm_settings

_log = logging.getLogger(__name__)
DEFAULT_PROMPT_TOKENS = 256  # `replayrl plan --prompt-tokens`' default
MIN_ENGINE_SHARE = 0.05  # below this a colocated engine is not worth suggesting


class DeviceMemory(NamedTuple):
    name: str  # e.g. cuda:0
    free: int  # bytes
    total: int  # bytes


# the learner GPUs' memory for a config: [] when the learners run on no GPU
MemoryQuery = Callable[[Config], list[DeviceMemory]]

_QUERY = (
    "import json, sys, torch\n"
    "ids = json.loads(sys.argv[1]) or list(range(torch.cuda.device_count()))\n"
    "print(json.dumps([[i, *torch.cuda.mem_get_info(i)] for i in ids]))\n"
)


def cuda_memory(cfg: Config) -> list[DeviceMemory]:
    """Free and total memory of the learner GPU (`train.device`), or with a multi-learner
    runtime of every visible GPU; [] where the learner runs on the CPU."""
    from replayrl.models.device import resolve_device

    device = resolve_device(cfg.train.device)
    if device.type != "cuda":
        return []
    ids: list[int] = []  # [] = every visible GPU
    if not RUNTIMES.get(cfg.runtime).multi_learner:
        ids = [device.index or 0]
    done = subprocess.run(
        [sys.executable, "-c", _QUERY, json.dumps(ids)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "no output")
    return [DeviceMemory(f"cuda:{i}", free, total) for i, free, total in json.loads(done.stdout)]


def prompt_tokens(cfg: Config) -> int:
    """The prompt length the estimate assumes (module docstring)."""
    longest = vllm_settings(cfg).max_model_len
    if longest is not None:
        return max(1, longest - cfg.rollout.max_new_tokens)
    return DEFAULT_PROMPT_TOKENS


def engine_reservation(cfg: Config, device: DeviceMemory) -> int:
    """Bytes a vLLM engine colocated with the learner reserves on `device` (module
    docstring); 0 where generation runs elsewhere or needs no GPU."""
    colocated = BACKENDS.get(cfg.rollout.backend).needs_gpu and RUNTIMES.get(cfg.runtime).lockstep
    return int(vllm_settings(cfg).gpu_memory_utilization * device.total) if colocated else 0


def _changed(cfg: Any, values: dict[str, Any]) -> Any:
    """A copy of `cfg` with dotted keys set: the plan reads fields, so nothing is validated
    (a validator that reads another section would see a half-changed config)."""
    update: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            update[head] = value
    for head, inner in nested.items():
        update[head] = _changed(getattr(cfg, head), inner)
    return cfg.model_copy(update=update)


def _estimate(cfg: Config, shape: dict[str, Any], prompt: int) -> int:
    return sum(learner_terms(cfg, shape, prompt).values())


def _knobs(cfg: Config, prompt: int) -> dict[str, list[dict[str, Any]]]:
    """Each knob's changes, least disruptive first: gradient checkpointing, fewer rows per
    micro-batch, more shards (which bring bf16 compute and checkpointing by default), LoRA."""
    from replayrl.bench.plan import shard_ranks

    rows = micro_rows(cfg, prompt + cfg.rollout.max_new_tokens)
    ranks = shard_ranks(cfg)
    knobs: dict[str, list[dict[str, Any]]] = {
        "gradient checkpointing": [{"model.gradient_checkpointing": True}],
        # the token budget that packs as many rows is named beside it (`_overrides`)
        "rows per micro-batch": [
            {"train.micro_batch_size": n, "train.max_tokens_per_micro_batch": None}
            for n in range(rows - 1, 0, -1)
        ],
        "more shards": [
            {
                "runtime": "ray",
                "workers.learners": n * cfg.train.sharding_replicas,
                "train.sharding": "fsdp",
            }
            for n in (2, 4, 8, 16, 32, 64)
            if n > ranks
        ],
        "LoRA": [] if cfg.model.lora.enabled else [{"model.lora.enabled": True}],
    }
    return {name: changes for name, changes in knobs.items() if changes}


def _overrides(change: dict[str, Any], seq: int) -> str:
    """`key=value` overrides of a change; fewer rows also as the equivalent token budget."""
    text = " ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in change.items()
        if v is not None
    )
    if "train.micro_batch_size" in change:
        budget = change["train.micro_batch_size"] * seq
        text += f" (or train.max_tokens_per_micro_batch={budget}: {seq}-token rows)"
    return text


def suggestions(
    cfg: Config, shape: dict[str, Any], prompt: int, free: int, device: DeviceMemory | None = None
) -> str:
    """Per knob, the least change the plan says fits in `free` bytes (what the learner has
    beside a colocated engine's reservation on `device`); where no single knob does, each
    knob's largest change with its estimate. With a colocated engine, the largest
    `vllm.gpu_memory_utilization` beside the learner as it is is a knob too."""
    now = _estimate(cfg, shape, prompt)
    seq = prompt + cfg.rollout.max_new_tokens
    fitting, closest = [], []
    if device is not None and engine_reservation(cfg, device):
        share = int((device.free - now) / device.total * 100) / 100  # rounded down
        if share >= MIN_ENGINE_SHARE:
            fitting.append(
                f"vLLM's share: vllm.gpu_memory_utilization={share:.2f} (its weights and KV "
                "cache must fit in it)"
            )
    for name, changes in _knobs(cfg, prompt).items():
        estimates = [(c, _estimate(_changed(cfg, c), shape, prompt)) for c in changes]
        estimates = [(c, e) for c, e in estimates if e < now]  # e.g. checkpointing already on
        if not estimates:
            continue
        fit = next(((c, e) for c, e in estimates if e <= free), None)
        change, e = fit if fit is not None else min(estimates, key=lambda ce: ce[1])
        (fitting if fit is not None else closest).append(
            f"{name}: {_overrides(change, seq)} (plan: {e / GIB:.1f} GiB)"
        )
    if fitting:
        return "Each of these alone fits: " + "; ".join(fitting) + "."
    return "No single change fits; combine them (plan with each alone): " + "; ".join(closest) + "."


def _message(cfg: Config, shape: dict[str, Any], prompt: int, device: DeviceMemory) -> str:
    terms = learner_terms(cfg, shape, prompt)
    need = sum(terms.values())
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in terms.items() if v >= GIB // 10)
    engine = engine_reservation(cfg, device)
    advice = suggestions(cfg, shape, prompt, device.free - engine, device)
    beside = (
        f", beside the {engine / GIB:.1f} GiB the vLLM engine in the same process reserves "
        f"(vllm.gpu_memory_utilization={vllm_settings(cfg).gpu_memory_utilization:g} of the GPU)"
        if engine
        else ""
    )
    return (
        f"the learner does not fit: `replayrl plan` estimates {need / GIB:.1f} GiB per learner "
        f"GPU ({parts} GiB; {prompt} prompt + {cfg.rollout.max_new_tokens} completion tokens "
        f"per row){beside} but {device.name} has {device.free / GIB:.1f} GiB free of "
        f"{device.total / GIB:.1f} GiB. {advice} The estimate is a plan, not a measurement: "
        "train.preflight=warn starts anyway, train.preflight=off skips the check"
    )


def preflight(
    cfg: Config, log: Callable[[str], None], memory: MemoryQuery | None = None
) -> int | None:
    """Check the run's learner against its GPU (module docstring). Returns the estimate in
    bytes when it was checked and fits (or `warn` let it start), None when not checked;
    raises RunDoesNotFit (`train.preflight=error`). `memory`: the learner GPUs' memory
    (None: `cuda_memory`)."""
    if cfg.train.preflight == "off":
        return None
    if cfg.model.path is None:
        _log.debug("train.preflight: the built-in tiny model is not checked")
        return None
    try:
        shape = model_shape(cfg)
    except ValueError as exc:  # a hub name, not a local folder: no config.json to read
        _log.debug("train.preflight: not checked (%s)", exc)
        return None
    try:
        devices = (memory or cuda_memory)(cfg)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        log(f"train.preflight: the GPU memory could not be read ({exc}); not checked")
        return None
    if not devices:
        _log.debug("train.preflight: the learner runs on the CPU; not checked")
        return None
    prompt = prompt_tokens(cfg)
    need = _estimate(cfg, shape, prompt)
    # the GPU with the least room for the learner beside a colocated engine's reservation
    smallest = min(devices, key=lambda d: d.free - engine_reservation(cfg, d))
    if need + engine_reservation(cfg, smallest) <= smallest.free:
        _log.debug(
            "train.preflight: %.1f GiB fits in %.1f GiB free", need / GIB, smallest.free / GIB
        )
        return need
    message = _message(cfg, shape, prompt, smallest)
    if cfg.train.preflight == "error":
        raise RunDoesNotFit(message)
    log(f"warning: {message}")
    return need
