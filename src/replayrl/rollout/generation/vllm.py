"""Sampling with a vLLM engine (rollout.backend = vllm), behind the same Generator interface.

Not yet run on a GPU: checked with a recording stand-in for `vllm` (tests/fake_vllm) whose
calls are compared with a snapshot of vLLM 0.33.0's signatures
(tests/data/vllm_0.33.0_signatures.json, scripts/vllm_signatures.py).

Assumptions (vLLM >= 0.11, V1 engine):
- Behaviour log-probs: `logprobs_mode="processed_logprobs"` returns log softmax of the logits
  after temperature *and* top-k/top-p masking (vllm/v1/sample/ops/topk_topp_sampler.py), so
  it equals the HF backend's log softmax(logits / temperature) only with top_p = 1 (and top_k,
  min_p, penalties off); `raw_logprobs` (the default) ignores temperature. Hence top_p < 1 is
  refused here. Greedy requests return log softmax(logits), as the HF backend stores.
- Weight sync: the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with
  tensor_parallel_size = 1, so `llm.llm_engine.model_executor.driver_worker` is reachable
  and its model's `load_weights` takes HF-named tensors (as TRL's colocate mode does).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from replayrl.config.schema import VLLMConfig
from replayrl.models.lora_merge import merged_lora_tensors
from replayrl.rollout.generation.base import Sample, SamplingParams


def _import_vllm() -> Any:
    # The in-process engine core is what makes the driver worker (and its model) reachable
    # from load_weights(); vLLM reads this variable when the engine is built.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "rollout.backend=vllm needs vLLM (pip install vllm, or replayrl[vllm]), which "
            "needs a CUDA GPU; use rollout.backend=hf otherwise"
        ) from exc
    return vllm


@contextmanager
def trainer_state_kept() -> Iterator[None]:
    """Run a block that may reseed Python's, numpy's and torch's global generators and change
    torch's thread count (vLLM's engine start does both); restore all of them after it."""
    threads = torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def check_engine_device(device: torch.device | None) -> None:
    """The engine runs on the first GPU its process sees (vLLM's in-process executor takes
    local rank 0, vllm/v1/executor/uniproc_executor.py), so a policy on cuda:N, N > 0, in
    the same process would get its engine on GPU 0: refused with the fix. Worker processes
    are pinned to their GPU before CUDA starts (distributed/gpus.py), so they see cuda:0."""
    if device is not None and device.type == "cuda" and (device.index or 0) != 0:
        raise ValueError(
            f"rollout.backend=vllm builds its engine on this process's first GPU, not "
            f"{device}: run with CUDA_VISIBLE_DEVICES={device.index} and train.device=cuda"
        )


class VLLMGenerator:
    """A vLLM engine on `model_path`; `load_weights` pushes new policy weights into it."""

    def __init__(
        self,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase,
        cfg: VLLMConfig,
        max_prompt_len: int | None = None,
        max_new_tokens: int | None = None,
        dtype: str = "auto",
        policy_version: int = 0,
        seed: int | None = None,
        stop_ids: list[int] | None = None,
        lora_scaling: float | None = None,
        device: torch.device | None = None,
    ) -> None:
        check_engine_device(device)  # `device`: the policy's, in this process
        self._vllm = _import_vllm()
        # a LoRA policy (alpha / r): pushed weights are merged, base + s B A (the engine holds
        # a plain model, as TRL's vLLM weight sync does)
        self.lora_scaling = lora_scaling
        self.tokenizer = tokenizer
        self.policy_version = policy_version
        self.tensor_parallel_size = cfg.tensor_parallel_size
        # the same stop tokens as the HF backend (generation_config's EOS ids, stops.py)
        eos = tokenizer.eos_token_id
        self.stop_ids = list(stop_ids) if stop_ids else ([] if eos is None else [eos])
        # Explicit cfg.max_model_len wins; else the run's prompt + completion bound (a small
        # KV reservation); else None and vLLM takes the model's own context length.
        self.max_model_len = cfg.max_model_len
        if self.max_model_len is None and max_prompt_len and max_new_tokens:
            self.max_model_len = max_prompt_len + max_new_tokens
        with trainer_state_kept():
            # vLLM's worker seeds random / numpy / torch with its own seed and sets torch's
            # threads to 1: the trainer's streams and threads are put back afterwards
            self.llm = self._vllm.LLM(
                model=model_path,
                dtype=dtype,
                seed=seed if seed is not None else (cfg.seed or 0),
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                tensor_parallel_size=cfg.tensor_parallel_size,
                enforce_eager=cfg.enforce_eager,
                max_model_len=self.max_model_len,
                # log softmax(logits / T) of the sampled token: what the learner recomputes
                logprobs_mode="processed_logprobs",
            )

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        # our own ids, not vLLM's tokenisation (which would add a BOS): same as the HF backend
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _sampling_params(self, num_samples: int, params: SamplingParams) -> Any:
        if not params.greedy and params.top_p < 1.0:
            raise ValueError(
                f"rollout.backend=vllm with top_p={params.top_p}: vLLM's log-probs are then "
                "renormalised over the top-p set, not log softmax(logits / temperature) as "
                "the learner assumes; use top_p=1 or rollout.backend=hf"
            )
        # Every knob explicit (top_k=0 and min_p=0 are "off"), so the sampled distribution is
        # exactly softmax(logits / T), or argmax when greedy (temperature 0).
        return self._vllm.SamplingParams(
            n=num_samples,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # only the sampled token's log-prob
            stop_token_ids=self.stop_ids,
            skip_special_tokens=True,
        )

    def generate(
        self, prompts: list[str], num_samples: int, params: SamplingParams
    ) -> list[Sample]:
        encoded = self._encode(prompts)
        if self.max_model_len is not None:
            longest = max(len(ids) for ids in encoded)
            if longest + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"a prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} "
                    f"exceeds the vLLM engine's max_model_len={self.max_model_len} "
                    "(set vllm.max_model_len)"
                )
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in encoded],
            self._sampling_params(num_samples, params),
            use_tqdm=False,
        )
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        samples: list[Sample] = []
        for prompt_index, (ids, out) in enumerate(zip(encoded, outputs, strict=True)):
            prompt_ids = torch.tensor(ids, dtype=torch.long)
            for comp in sorted(out.outputs, key=lambda c: c.index):
                samples.append(self._to_sample(prompt_index, prompt_ids, comp))
        return samples

    def _to_sample(self, prompt_index: int, prompt_ids: torch.Tensor, comp: Any) -> Sample:
        """One vLLM CompletionOutput as a Sample (ids up to and including the first stop)."""
        token_ids = list(comp.token_ids)
        if comp.logprobs is None or len(comp.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token log-probs (logprobs=0 was requested)")
        # one dict per position, {token id: Logprob}; with logprobs=0 it holds the sampled token
        logprobs = [comp.logprobs[i][tok].logprob for i, tok in enumerate(token_ids)]
        # vLLM stops on a stop token and keeps it in token_ids; cut at the first one anyway
        hits = [i for i, tok in enumerate(token_ids) if tok in self.stop_ids]
        if hits:
            token_ids, logprobs = token_ids[: hits[0] + 1], logprobs[: hits[0] + 1]
        completion = torch.tensor(token_ids, dtype=torch.long)
        return Sample(
            prompt_index=prompt_index,
            prompt_ids=prompt_ids.clone(),
            completion_ids=completion,
            logprobs=torch.tensor(logprobs, dtype=torch.float32),
            text=self.tokenizer.decode(completion, skip_special_tokens=True),
            # "length": max_tokens reached; "stop": EOS or another stop token of the model
            truncated=not hits and comp.finish_reason != "stop",
            policy_version=self.policy_version,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy new policy weights (HF parameter names) into the engine; drop stale KV cache."""
        if self.tensor_parallel_size != 1:
            raise NotImplementedError(
                "VLLMGenerator.load_weights supports vllm.tensor_parallel_size=1 only"
            )
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        if executor is None or not hasattr(executor, "driver_worker"):
            raise RuntimeError(
                "the vLLM engine core is not in this process: VLLM_ENABLE_V1_MULTIPROCESSING "
                "must be 0 before the engine is built (VLLMGenerator sets it)"
            )
        model = executor.driver_worker.worker.model_runner.get_model()
        if self.lora_scaling is not None:
            named_tensors = merged_lora_tensors(named_tensors, self.lora_scaling)
        model.load_weights(named_tensors)  # streams; maps HF names onto fused qkv / gate_up
        # cached prefix blocks hold keys/values computed with the old weights
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        self.policy_version = version
