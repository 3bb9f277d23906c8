"""Batched sampling with transformers' `generate`, returning behaviour log-probs.

The stored log-prob of a token is log softmax(logits / temperature), the distribution the
learner recomputes; top-p only truncates the candidate set (as in vLLM/verl's returned
log-probs), so with top_p < 1 the stored value is that of the untruncated tempered policy.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from replayrl.generation.base import Sample, SamplingParams


class HFGenerator:
    """Generates with the (shared) policy module; `policy_version` is set by the owner."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        policy_version: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.policy_version = policy_version

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    @torch.no_grad()
    def generate(
        self, prompts: list[str], num_samples: int, params: SamplingParams
    ) -> list[Sample]:
        encoded = self._encode(prompts)
        jobs = [(i, ids) for i, ids in enumerate(encoded) for _ in range(num_samples)]
        out: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(jobs), self.batch_size):
                out.extend(self._generate_batch(jobs[start : start + self.batch_size], params))
        finally:
            self.model.train(was_training)
        return out

    def _generate_batch(
        self, jobs: list[tuple[int, list[int]]], params: SamplingParams
    ) -> list[Sample]:
        tok = self.tokenizer
        pad, eos = tok.pad_token_id, tok.eos_token_id
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
            top_k=0 if not params.greedy else None,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            bos_token_id=tok.bos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        saved = self.model.generation_config
        self.model.generation_config = GenerationConfig()  # no model defaults to merge in
        try:
            res = self.model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=gen_cfg
            )
        finally:
            self.model.generation_config = saved
        new_tokens = res.sequences[:, width:]
        logits = torch.stack(res.logits, dim=1).float()  # raw logits, (batch, steps, vocab)
        temperature = 1.0 if params.greedy else params.temperature
        logps = torch.log_softmax(logits / temperature, dim=-1)
        token_logps = logps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        samples = []
        for row, (prompt_index, ids) in enumerate(jobs):
            toks = new_tokens[row]
            hits = (toks == eos).nonzero()
            length = int(hits[0]) + 1 if len(hits) else toks.numel()
            completion = toks[:length].clone()
            samples.append(
                Sample(
                    prompt_index=prompt_index,
                    prompt_ids=torch.tensor(ids, dtype=torch.long),
                    completion_ids=completion,
                    logprobs=token_logps[row, :length].clone(),
                    text=tok.decode(completion, skip_special_tokens=True),
                    truncated=not len(hits),
                    policy_version=self.policy_version,
                )
            )
        return samples
