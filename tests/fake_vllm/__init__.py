"""A recording stand-in for the `vllm` package, checked against vLLM's signatures.

For what the CPU build of vLLM cannot run (CUDA devices, GPU memory shares, worker processes
pinned to GPUs); the engine itself is tested for real by `make test-vllm`. Every `LLM(...)`,
`SamplingParams(...)`, `LLM.generate(...)` and `LLM.collective_rpc(...)` call is recorded and
its arguments compared with tests/data/vllm_signatures.json (written from the installed
engine's source by scripts/vllm_signatures.py): an argument vLLM does not take fails the test
where the call is made. Outputs carry only fields vLLM's output classes have.

Engine start does what vLLM's worker does to the process it runs in: seeds Python's, numpy's
and torch's global generators with the engine seed and sets torch's threads to 1.
"""

from __future__ import annotations

import json
import os
import random
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

SNAPSHOT_PATH = Path(__file__).resolve().parents[1] / "data" / "vllm_signatures.json"
SNAPSHOT: dict[str, Any] = json.loads(SNAPSHOT_PATH.read_text())


def _check_call(what: str, kwargs: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise TypeError(f"vLLM {SNAPSHOT['vllm_version']} {what} has no argument(s) {unknown}")


def _params(key: str) -> set[str]:
    sig = SNAPSHOT[key]
    return set(sig["positional"]) | set(sig["keyword_only"])


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        _check_call("SamplingParams", kwargs, set(SNAPSHOT["SamplingParams"]))
        self.kwargs = kwargs


@dataclass
class FakeModel:
    loaded: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def load_weights(self, weights: Any) -> set[str]:
        self.loaded.extend(weights)
        return {name for name, _ in self.loaded}


class LLM:
    """Records its arguments; `generate` answers `script(prompt ids, params)` per prompt
    (default: max_tokens copies of the prompt's last token, log-prob -1 each)."""

    instances: list[LLM] = []
    script: Any = None

    def __init__(self, model: str, **kwargs: Any) -> None:
        init = _params("LLM.__init__")
        # LLM passes unknown keywords on to EngineArgs (e.g. logprobs_mode)
        _check_call("LLM.__init__", kwargs, init | set(SNAPSHOT["EngineArgs"]))
        self.kwargs = {"model": model, **kwargs}
        # the GPUs the engine can see: it runs on the first (vLLM's local rank 0)
        self.visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.calls: list[tuple[list[dict], Any, dict[str, Any]]] = []
        self.prefix_resets = 0
        self.model = FakeModel()
        # an engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), as vLLM names it
        self.llm_engine = SimpleNamespace(engine_core=InprocClient())
        # what vLLM's worker does at start (set_random_seed, and one thread without OMP)
        seed = kwargs.get("seed", 0)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        LLM.instances.append(self)

    def generate(self, prompts: Any, sampling_params: Any = None, **kwargs: Any) -> list:
        _check_call("LLM.generate", kwargs, _params("LLM.generate"))
        self.calls.append((prompts, sampling_params, kwargs))
        per_prompt = sampling_params if isinstance(sampling_params, list) else None
        out = []
        for i, p in enumerate(prompts):
            sp = (per_prompt[i] if per_prompt else sampling_params).kwargs
            ids = p["prompt_token_ids"]
            comps = []
            for j in range(sp.get("n", 1)):
                toks = [ids[-1]] * sp.get("max_tokens", 16)
                lps = [{t: Logprob(-1.0, rank=1)} for t in toks]
                comps.append(CompletionOutput(j, "", toks, -float(len(toks)), lps, "length"))
            out.append(RequestOutput(str(i), None, ids, None, comps, True))
        return out

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> list:
        """The worker method the backend calls: `reload_weights` (consumes the iterator)."""
        if method != "reload_weights":
            raise AttributeError(f"the stand-in's workers have no method {method!r}")
        _check_call("reload_weights", kwargs or {}, _params("GPUModelRunner.reload_weights"))
        return [self.model.load_weights(kwargs["weights_iterator"])]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


class InprocClient:
    """The class name vLLM gives an engine core that runs in the calling process."""


def module() -> types.ModuleType:
    """A fresh `vllm` module object (put it in sys.modules['vllm'])."""
    mod = types.ModuleType("vllm")
    mod.LLM = LLM  # type: ignore[attr-defined]
    mod.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    LLM.instances = []
    return mod


def install(monkeypatch: Any) -> types.ModuleType:
    mod = module()
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod
