"""The learner's batch: collated once per step on its device, frozen fields added to it,
micro-batches by rows or by a token budget, knobs resolved once, and a refreshed log pi_old
kept beside the rollouts the buffer holds."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch

import replayrl.learner.assembly as assembly_module
import replayrl.learner.context as context_module
from replayrl.config.schema import load_config
from replayrl.data.buffer.replay import ReplayBuffer
from replayrl.data.rollout_record import Rollout
from replayrl.learner.batching import collate, token_micro_batches
from replayrl.learner.learner import Learner
from tiny import bf16_sampled_rollouts


@pytest.fixture(scope="module")
def rollouts(tiny_model, char_tokenizer) -> list[Rollout]:
    return bf16_sampled_rollouts(tiny_model, char_tokenizer)


def _learner(model, pad: int, *overrides: str) -> Learner:
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=3",
            "rollout.num_generations=4",
            "train.lr=1e-3",
            *overrides,
        ],
    )
    return Learner(copy.deepcopy(model), pad, cfg)


def _grads(learner: Learner) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in learner.model.parameters()])


def test_rows_of_the_step_batch_are_the_batch_of_those_rows(rollouts, char_tokenizer):
    pad = char_tokenizer.pad_token_id
    extra = [torch.arange(r.completion_ids.numel(), dtype=torch.float32) for r in rollouts]
    full = collate(rollouts, pad, sampler_logprobs=extra)
    for rows in ([3, 0, 7], [11], list(range(12))):
        part = [rollouts[i] for i in rows]
        alone = collate(part, pad, sampler_logprobs=[extra[i] for i in rows])
        width = max(r.prompt_ids.numel() + r.completion_ids.numel() for r in part)
        taken = full.take(rows, width).tensors()
        assert taken.keys() == alone.tensors().keys()
        for k, v in alone.tensors().items():
            assert torch.equal(taken[k], v), k
    # each completion token's field sits where `mask` marks its target
    assert full.sampler_logprobs is not None
    for i, r in enumerate(rollouts):
        m = full.mask[i].bool()
        assert torch.equal(full.old_logprobs[i][m], r.behaviour_logprobs)
        assert torch.equal(full.sampler_logprobs[i][m], extra[i])


def test_collate_leaves_fields_on_the_device_they_are_on(rollouts, char_tokenizer):
    # frozen log-probs computed on the model's device stay there: no copy through the host
    meta = [torch.empty(r.completion_ids.numel(), device="meta") for r in rollouts]
    b = collate(rollouts, char_tokenizer.pad_token_id, meta, meta, device="meta")
    assert b.sampler_logprobs is not None
    assert all(v.device.type == "meta" for v in b.tensors().values())


def test_a_field_of_the_wrong_length_is_an_error(rollouts, char_tokenizer):
    short = [torch.zeros(1) for _ in rollouts]
    with pytest.raises(ValueError, match="token field 'sampler_logprobs'"):
        collate(rollouts, char_tokenizer.pad_token_id, sampler_logprobs=short)


def test_token_micro_batches_pack_by_padded_tokens_with_a_row_cap():
    lengths = [10, 9, 9, 4, 4, 4, 4, 3, 12]
    slices = token_micro_batches(lengths, max_tokens=20, max_rows=3)
    assert [i for sl in slices for i in range(len(lengths))[sl]] == list(range(len(lengths)))
    for sl in slices:
        part = lengths[sl]
        assert len(part) <= 3 and len(part) * max(part) <= 20
    assert [len(lengths[sl]) for sl in slices] == [2, 2, 3, 1, 1]
    # the row cap binds when the budget does not
    assert [len(lengths[sl]) for sl in token_micro_batches(lengths, 10**6, 4)] == [4, 4, 1]
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=11"):
        token_micro_batches(lengths, max_tokens=11, max_rows=3)
    # a row exactly as long as the budget fits, alone
    assert [len(lengths[sl]) for sl in token_micro_batches(lengths, 12, 3)] == [1, 1, 1, 3, 2, 1]


def _count_forwards(monkeypatch) -> list[int]:
    rows: list[int] = []
    inner = context_module.token_logprobs

    def spy(model, batch, *args, **kwargs):
        rows.append(int(batch.input_ids.shape[0]))
        return inner(model, batch, *args, **kwargs)

    monkeypatch.setattr(context_module, "token_logprobs", spy)
    return rows


@pytest.mark.parametrize("budget", [40, 90])
def test_token_budget_gives_the_row_split_gradient(
    rollouts, tiny_model, char_tokenizer, monkeypatch, budget: int
):
    pad = char_tokenizer.pad_token_id
    rows = _learner(tiny_model, pad, "train.micro_batch_size=5")
    m_rows = rows.train_step(rollouts, np.random.default_rng(0))
    forwards = _count_forwards(monkeypatch)
    tokens = _learner(
        tiny_model, pad, "train.micro_batch_size=8", f"train.max_tokens_per_micro_batch={budget}"
    )
    m_tokens = tokens.train_step(rollouts, np.random.default_rng(0))
    assert sum(forwards) == len(rollouts) and max(forwards) <= 8
    assert len(forwards) != 3  # a split other than the row count's 5, 5, 2
    assert m_tokens["loss"] == pytest.approx(m_rows["loss"], abs=1e-6)
    # the accumulated (clipped) gradients, left on the parameters after the step (weights
    # are not compared: Adam's first step, ~lr x sign(g), amplifies near-zero entries' noise)
    assert torch.allclose(_grads(tokens), _grads(rows), rtol=1e-4, atol=1e-7)


def test_long_completions_take_more_micro_batches_than_short_ones(
    tiny_model, char_tokenizer, monkeypatch
):
    pad = char_tokenizer.pad_token_id
    short = bf16_sampled_rollouts(tiny_model, char_tokenizer, 1, seed=1)
    long = bf16_sampled_rollouts(tiny_model, char_tokenizer, 12, seed=1)
    assert len(short) == len(long) == 12
    assert sum(r.completion_ids.numel() for r in long) > 3 * len(long)
    counts = {}
    for name, batch in (("short", short), ("long", long)):
        forwards = _count_forwards(monkeypatch)
        learner = _learner(tiny_model, pad, "train.max_tokens_per_micro_batch=60")
        learner.train_step(batch, np.random.default_rng(0))
        assert sum(forwards) == len(batch)
        counts[name] = len(forwards)
    assert counts["long"] > counts["short"]


def test_a_step_collates_once_and_resolves_the_loss_knobs_once(
    rollouts, tiny_model, char_tokenizer, monkeypatch
):
    """One host-to-device copy of the batch per step, however many mini- and micro-batches;
    the frozen passes (pi_k anchor, KL policies) read the same padded batch."""
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "train.micro_batch_size=2",
        "train.mini_batch_size=6",
        "train.epochs=2",
        "kl.beta=0.1",
        "algorithm.loss_type=mix_ppg",
    )
    collates, knobs = [], []
    inner_collate, inner_knobs = assembly_module.collate, learner.loss_knobs
    monkeypatch.setattr(
        assembly_module, "collate", lambda *a, **k: collates.append(1) or inner_collate(*a, **k)
    )
    monkeypatch.setattr(learner, "loss_knobs", lambda: knobs.append(1) or inner_knobs())
    batch = [copy.copy(r) for r in rollouts]
    learner.version = 1
    for r in batch[::2]:
        r.policy_version = 1  # half fresh, half stale: Mix-PPG's anchor pass runs
    m = learner.train_step(batch, np.random.default_rng(0), step=1)
    assert np.isfinite(m["loss"]) and "kl_to_base" in m
    assert len(collates) == 1 and len(knobs) == 1


def test_a_buffer_held_rollout_is_unchanged_by_the_log_pi_old_refresh(
    rollouts, tiny_model, char_tokenizer
):
    buffer = ReplayBuffer(64, seed=0)
    stored = [copy.deepcopy(r) for r in rollouts]
    buffer.push(stored)
    before = [(r.behaviour_logprobs.clone(), dict(r.extras)) for r in buffer.items()]
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "precision.recompute_behaviour_logprobs=always",
        "train.micro_batch_size=5",
    )
    batch = buffer.sample(len(stored))
    assert all(any(r is s for s in stored) for r in batch)  # the buffer's own objects
    m = learner.train_step(batch, np.random.default_rng(0))
    assert m["behaviour_refreshed"] == len(batch)
    assert m["behaviour_mismatch_max"] > 1e-3  # the bf16 sampler vs the fp32 learner
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-5)  # trained on the refreshed pi_old
    for r, (lp, extras) in zip(buffer.items(), before, strict=True):
        assert torch.equal(r.behaviour_logprobs, lp) and r.extras == extras
        # the learner's own log pi_old lives beside the rollout, for its replays
        refreshed = learner.pi_old.of(r)
        assert learner.pi_old.refreshed(r) and not torch.equal(refreshed, lp)
    # a checkpoint keeps them for the restored buffer's copies of the rollouts
    saved = io.BytesIO()
    torch.save(learner.state_dict(), saved)
    saved.seek(0)
    resumed = _learner(tiny_model, char_tokenizer.pad_token_id)
    resumed.load_state_dict(torch.load(saved, weights_only=True))
    restored = ReplayBuffer(64, seed=0)
    restored.load_state_dict(copy.deepcopy(buffer.state_dict()))
    for a, b in zip(restored.items(), buffer.items(), strict=True):
        assert a.behaviour_logprobs is not b.behaviour_logprobs
        assert torch.equal(resumed.pi_old.of(a), learner.pi_old.of(b))


def test_no_rollouts_give_no_log_probs(tiny_model, char_tokenizer):
    learner = _learner(tiny_model, char_tokenizer.pad_token_id)
    assert learner.current_logprobs([]) == [] and learner.mean_entropies([]) == []


def test_a_resumed_replay_run_trains_on_the_refreshed_log_pi_old(tmp_path, monkeypatch):
    """The refreshed log pi_old of rollouts the buffer still holds is part of the checkpoint:
    a bf16-sampled replay run crashed and resumed trains exactly as the uninterrupted one."""
    from tiny import TINY_RUN, crash_and_resume

    over = [*TINY_RUN, "train.threads=1", "checkpoint.every=1", "train.epochs=2"]
    over += ["precision.generation=bfloat16", "precision.recompute_behaviour_logprobs=always"]
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, "replay", over
    )
    assert all(s["train/behaviour_refreshed"] > 0 for s in whole_steps)
    assert all(s["train/behaviour_not_refreshed"] == 0 for s in whole_steps)
    assert crash_steps == whole_steps and len(whole_steps) == 4


@pytest.mark.parametrize("fuse", [True, False])
def test_a_rollout_twice_in_the_batch_is_refreshed_once_and_trained_on_it_twice(
    rollouts, tiny_model, char_tokenizer, fuse: bool
):
    learner = _learner(
        tiny_model,
        char_tokenizer.pad_token_id,
        "precision.recompute_behaviour_logprobs=always",
        "train.micro_batch_size=3",
    )
    learner.fuse_behaviour_recompute = fuse
    batch = [copy.deepcopy(r) for r in rollouts[:6]]
    m = learner.train_step(batch + batch[:2], np.random.default_rng(0))  # group replay's case
    assert m["behaviour_refreshed"] == 6 and len(learner.pi_old) == 6
    assert m["behaviour_mismatch_max"] > 1e-3
    # every row, the repeated ones too, starts from the refreshed log pi_old: ratio 1
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
