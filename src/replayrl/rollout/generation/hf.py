"""Batched sampling with a transformers causal LM, returning behaviour log-probs.

The stored log-prob of a token is log softmax(logits / temperature), the distribution the
learner recomputes; top-p only truncates the candidate set (as in vLLM/verl's returned
log-probs), so with top_p < 1 the stored value is that of the untruncated tempered policy.

Three implementations behind one interface:
- `fast` (default): our own decode loop (generation/decoders.py) with a KV cache. Each
  prompt is prefilled once and its cache shared by its completions; tokens are drawn by
  inverse-CDF sampling (generation/sampling.py) and only the sampled token's log-prob is
  kept (no per-step full-vocabulary logits stored); rows that finished are dropped from the
  batch once enough of them have. Llama-architecture models run on `LlamaDecoder` (KV cache
  preallocated and written in place, lean layer loop); other models, and `fast_hf`, go
  through the model's own forward and transformers' cache (`HFDecoder`).
- `generate`: transformers' `generate` with `output_logits=True` (the reference; slower).
`dtype` (e.g. bfloat16) generates with a copy of the policy in that dtype, refreshed from
the policy's weights at every `generate` call, so the policy's master weights stay fp32.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from replayrl.rollout.generation.base import Sample, SamplingParams
from replayrl.rollout.generation.decoders import make_decoder
from replayrl.rollout.generation.sampling import sample_next
from replayrl.rollout.generation.stops import stop_token_ids

GenerationImpl = Literal["fast", "fast_hf", "generate"]
# drop finished rows from the decode batch (one copy of the KV cache) once this share of the
# batch has finished: decode steps cost about the same at any small batch (weight reads), so
# compacting on every finish would spend more on cache copies than it saves
_COMPACT_FRACTION = 0.25
# decoding steps between looks at which rows finished, on an accelerator: each look waits for
# the device (a host sync), so one per token would stall the GPU's queue twice per token;
# finished rows run on (their tokens dropped) until the next look


def host_check_every(device: torch.device) -> int:
    """Steps between the decode loop's host reads of `done` on `device`: every step on the CPU
    (no queue to stall, and the random draws, hence the samples, stay those of every-step
    checks), every 8 on a GPU."""
    return 1 if device.type == "cpu" else 8


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class HFGenerator:
    """Generates with the (shared) policy module; `policy_version` is set by the owner."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        policy_version: int = 0,
        *,
        impl: GenerationImpl = "fast",
        dtype: torch.dtype | None = None,
        stop_ids: list[int] | None = None,
    ) -> None:
        if impl not in ("fast", "fast_hf", "generate"):
            raise ValueError(f"HFGenerator impl={impl!r}: use 'fast', 'fast_hf' or 'generate'")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.policy_version = policy_version
        self.impl = impl
        self.dtype = dtype
        self._copy: torch.nn.Module | None = None  # the policy in `dtype`, when that differs
        # a completion ends at the first of these (the vLLM backend stops on the same ones)
        self.stop_ids = list(stop_ids) if stop_ids else stop_token_ids(None, tokenizer)

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _sampling_model(self) -> torch.nn.Module:
        """The policy, or its copy in `self.dtype` with the policy's current weights."""
        if self.dtype is None or next(self.model.parameters()).dtype == self.dtype:
            return self.model
        if self._copy is None:
            self._copy = copy.deepcopy(self.model).to(self.dtype)
            for p in self._copy.parameters():
                p.requires_grad_(False)
        else:
            with torch.no_grad():
                src = list(self.model.parameters()) + list(self.model.buffers())
                dst = list(self._copy.parameters()) + list(self._copy.buffers())
                for s, d in zip(src, dst, strict=True):
                    d.copy_(s)
        return self._copy

    @torch.no_grad()
    def generate(
        self, prompts: list[str], num_samples: int, params: SamplingParams
    ) -> list[Sample]:
        encoded = self._encode(prompts)
        model = self._sampling_model()
        out: list[Sample] = []
        was_training = model.training
        model.eval()
        try:
            if self.impl == "generate":
                jobs = [(i, ids) for i, ids in enumerate(encoded) for _ in range(num_samples)]
                for start in range(0, len(jobs), self.batch_size):
                    batch = jobs[start : start + self.batch_size]
                    out.extend(self._generate_batch_hf(model, batch, params))
            else:
                for groups in self._fast_batches(encoded, num_samples):
                    out.extend(self._generate_batch_fast(model, groups, params))
        finally:
            model.train(was_training)
        return out

    # -- fast path -----------------------------------------------------------------------
    def _fast_batches(
        self, encoded: list[list[int]], num_samples: int
    ) -> list[list[tuple[int, list[int], int]]]:
        """(prompt index, ids, completions) groups, at most `batch_size` completions per
        batch, in prompt order (a prompt with more samples than that spans batches)."""
        batches: list[list[tuple[int, list[int], int]]] = []
        current: list[tuple[int, list[int], int]] = []
        room = self.batch_size
        for i, ids in enumerate(encoded):
            left = num_samples
            while left:
                if room == 0:
                    batches.append(current)
                    current, room = [], self.batch_size
                take = min(left, room)
                current.append((i, ids, take))
                left -= take
                room -= take
        if current:
            batches.append(current)
        return batches

    def _generate_batch_fast(
        self,
        model: torch.nn.Module,
        groups: list[tuple[int, list[int], int]],
        params: SamplingParams,
    ) -> list[Sample]:
        tok = self.tokenizer
        pad = tok.pad_token_id
        device = _device(model)
        stops = torch.tensor(self.stop_ids, dtype=torch.long, device=device)
        width = max(len(ids) for _, ids, _ in groups)
        input_ids = torch.full((len(groups), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, (_, ids, _) in enumerate(groups):  # left padding
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp_(min=0)
        steps = params.max_new_tokens
        decoder = make_decoder(model, steps, lean=self.impl == "fast")
        # one prefill per distinct prompt; only the last position's logits are computed
        logits = decoder.prefill(input_ids, attention, positions)
        counts = torch.tensor([n for _, _, n in groups], device=device)
        rows_of = torch.repeat_interleave(torch.arange(len(groups), device=device), counts)
        if rows_of.numel() != len(groups):
            decoder.select(rows_of)  # each prompt's cache, once per completion
            logits = logits[rows_of]
        next_pos = positions[rows_of, -1] + 1
        n_rows = rows_of.numel()
        tokens = torch.full((n_rows, steps), pad, dtype=torch.long, device=device)
        logps = torch.zeros((n_rows, steps), dtype=torch.float32, device=device)
        live = torch.arange(n_rows, device=device)  # output row of each batch row
        done = torch.zeros(n_rows, dtype=torch.bool, device=device)  # per batch row
        temperature = 1.0 if params.greedy else params.temperature
        check_every = host_check_every(device)
        seen = None  # the repetition penalty's tokens per row: the prompt's, then each sampled
        if params.repetition_penalty != 1.0 and not params.greedy:
            seen = torch.zeros(n_rows, logits.shape[1], dtype=torch.bool)
            for row, ids in enumerate(ids for _, ids, n in groups for _ in range(n)):
                seen[row, ids] = True
            seen = seen.to(device)
        for step in range(steps):
            nxt, lp = sample_next(
                logits,
                temperature,
                params.top_p,
                params.greedy,
                top_k=params.top_k,
                min_p=params.min_p,
                repetition_penalty=params.repetition_penalty,
                seen=seen,
            )
            if seen is not None:
                seen[torch.arange(nxt.numel(), device=device), nxt] = True
            # rows already finished keep running until compaction: their tokens are dropped
            # (where, not a boolean-mask index: that would sync with the host to size it)
            tokens[live, step] = torch.where(done, tokens[live, step], nxt)
            logps[live, step] = torch.where(done, logps[live, step], lp)
            done = done | torch.isin(nxt, stops)
            if step == steps - 1:
                break
            if (step + 1) % check_every:
                logits = decoder.step(nxt, next_pos)
                next_pos = next_pos + 1
                continue
            n_done = int(done.sum())  # the one host sync of this look
            if n_done == done.numel():
                break
            if n_done >= max(1, int(_COMPACT_FRACTION * done.numel())):
                keep = (~done).nonzero().squeeze(1)
                decoder.select(keep)
                live, nxt, next_pos, done = live[keep], nxt[keep], next_pos[keep], done[keep]
                seen = seen[keep] if seen is not None else None
            logits = decoder.step(nxt, next_pos)
            next_pos = next_pos + 1
        prompts = [(i, ids) for i, ids, n in groups for _ in range(n)]
        return self._samples(prompts, tokens.cpu(), logps.cpu())

    def _samples(
        self, jobs: list[tuple[int, list[int]]], new_tokens: torch.Tensor, token_logps: torch.Tensor
    ) -> list[Sample]:
        tok = self.tokenizer
        stops = torch.tensor(self.stop_ids, dtype=torch.long)
        samples = []
        for row, (prompt_index, ids) in enumerate(jobs):
            toks = new_tokens[row]
            hits = torch.isin(toks, stops).nonzero()
            length = int(hits[0]) + 1 if len(hits) else toks.numel()
            completion = toks[:length].clone()
            samples.append(
                Sample(
                    prompt_index=prompt_index,
                    prompt_ids=torch.tensor(ids, dtype=torch.long),
                    completion_ids=completion,
                    logprobs=token_logps[row, :length].float().clone(),
                    text=tok.decode(completion, skip_special_tokens=True),
                    truncated=not len(hits),
                    policy_version=self.policy_version,
                )
            )
        return samples

    # -- reference path: transformers generate -----------------------------------------------
    def _generate_batch_hf(
        self, model: torch.nn.Module, jobs: list[tuple[int, list[int]]], params: SamplingParams
    ) -> list[Sample]:
        tok = self.tokenizer
        pad = tok.pad_token_id
        stops = self.stop_ids
        eos: int | list[int] | None = stops[0] if len(stops) == 1 else (stops or None)
        width = max(len(ids) for _, ids in jobs)
        input_ids = torch.full((len(jobs), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, (_, ids) in enumerate(jobs):  # left padding
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        # Every knob explicit: `generate` fills unset ones from the model's own
        # generation_config (e.g. top_k=20, repetition_penalty=1.05), which would sample from
        # a distribution other than the one whose log-probs we store.
        gen_cfg = GenerationConfig(
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else 1.0,
            top_p=params.top_p if not params.greedy else 1.0,
            top_k=params.top_k if not params.greedy else None,
            min_p=(params.min_p or None) if not params.greedy else None,
            typical_p=1.0,
            repetition_penalty=params.repetition_penalty if not params.greedy else 1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            bos_token_id=tok.bos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        saved = model.generation_config
        model.generation_config = GenerationConfig()  # no model defaults to merge in
        device = _device(model)
        try:
            res = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=gen_cfg,
            )
        finally:
            model.generation_config = saved
        new_tokens = res.sequences[:, width:]
        logits = torch.stack(res.logits, dim=1).float()  # raw logits, (batch, steps, vocab)
        temperature = 1.0 if params.greedy else params.temperature
        logps = torch.log_softmax(logits / temperature, dim=-1)
        token_logps = logps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return self._samples(jobs, new_tokens.cpu(), token_logps.cpu())
