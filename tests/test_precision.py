"""Precision policy: the oneDNN fp32 switch keeps fp32 accuracy; fresh rollouts get the
learner's own log pi_old; generation-dtype resolution."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import collate, token_logprobs, unpad
from replayrl.learner.pi_old import PiOld, fresh_rollouts, refresh_counts
from replayrl.models import precision
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.run.start import train
from tiny import tiny_config


def _rollout(version: int, logps: list[float]) -> Rollout:
    n = len(logps)
    return Rollout(
        prompt_ids=torch.tensor([5, 6]),
        completion_ids=torch.arange(7, 7 + n),
        behaviour_logprobs=torch.tensor(logps),
        reward=0.0,
        advantage=0.0,
        correct=False,
        group_id=0,
        policy_version=version,
        step=0,
    )


def test_fast_fp32_matmul_keeps_fp32_accuracy():
    try:
        on = precision.enable_fast_fp32_matmul()
        # whether or not this CPU takes the oneDNN path, fp32 matmuls stay fp32-accurate
        assert precision._matmul_error() < 1e-5
        if on:
            assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"
    finally:
        precision.disable_fast_fp32_matmul()
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_generation_and_autocast_dtypes():
    assert precision.generation_dtype("auto", torch.float32) is None
    assert precision.generation_dtype("float32", torch.float32) is None
    assert precision.generation_dtype("bfloat16", torch.float32) == torch.bfloat16
    assert precision.autocast_dtype("none") is None
    assert precision.autocast_dtype("bfloat16") == torch.bfloat16
    cfg = load_config(None, ["precision.generation=bfloat16"])
    assert cfg.precision.learner_autocast == "auto" and cfg.precision.fast_fp32_matmul


def _refresh(rollouts, version, table, recompute):
    """What the learner's separate no-grad pass does: counts, then the fresh ones stored."""
    counts = refresh_counts(rollouts, version, table)
    fresh = fresh_rollouts(rollouts, version, table)
    return {**counts, **(table.store(fresh, recompute(fresh)) if fresh else {})}


def test_refresh_replaces_only_fresh_unrefreshed_rollouts():
    fresh = _rollout(3, [-1.0, -2.0])
    stale = _rollout(2, [-0.5])
    calls = []

    def recompute(rs):
        calls.append(len(rs))
        return [r.behaviour_logprobs + 0.1 for r in rs]

    table = PiOld()
    stats = _refresh([fresh, stale], 3, table, recompute)
    assert calls == [1]
    assert torch.allclose(table.of(fresh), torch.tensor([-0.9, -1.9]))
    # beside the rollout, not in it: the stored rollout keeps its sampler's log-probs
    assert torch.equal(fresh.behaviour_logprobs, torch.tensor([-1.0, -2.0]))
    assert torch.equal(table.sampler(fresh), torch.tensor([-1.0, -2.0]))
    assert "sampler_logprobs" not in fresh.extras
    assert torch.equal(table.of(stale), torch.tensor([-0.5]))  # untouched
    assert stats["behaviour_refreshed"] == 1 and stats["behaviour_not_refreshed"] == 1
    assert abs(stats["behaviour_mismatch_mean"] - 0.1) < 1e-6
    assert stats["behaviour_ratio_outside"] == 0.0  # exp(0.1) = 1.105 is inside [0.8, 1.2]
    # a second pass (the rollout replayed later) leaves it alone
    stats = _refresh([fresh], 3, table, recompute)
    assert calls == [1] and stats["behaviour_refreshed"] == 0
    # a copy sharing the sampler's values (a group source's reuse) shares the refresh
    copy_ = dataclasses.replace(fresh)
    assert torch.allclose(table.of(copy_), torch.tensor([-0.9, -1.9]))


def test_refreshed_log_pi_old_survives_a_checkpoint_and_leaves_with_its_rollout():
    fresh = _rollout(3, [-1.0, -2.0])
    table = PiOld()
    table.store([fresh], [torch.tensor([-0.75, -1.5])])
    saved = table.state_dict()
    restored = PiOld()
    restored.load_state_dict(saved)
    # the resumed buffer's rollout: new tensors, the same sampler values
    again = _rollout(3, [-1.0, -2.0])
    assert restored.refreshed(again)
    assert torch.equal(restored.of(again), torch.tensor([-0.75, -1.5]))
    assert not restored.refreshed(_rollout(3, [-1.0, -2.5]))
    del fresh, saved
    gc.collect()
    assert len(table) == 0  # evicted with the rollout's sampler tensor


def test_identical_completions_both_find_their_log_pi_old_after_a_resume():
    # two members of a group with the same completion share the sampler's log-probs and the
    # learner's; after a resume each must get the learner's, not just the first one met
    table = PiOld()
    a, b = _rollout(3, [-1.0, -2.0]), _rollout(3, [-1.0, -2.0])
    table.store([a, b], [torch.tensor([-0.75, -1.5])] * 2)
    restored = PiOld()
    restored.load_state_dict(table.state_dict())
    again_a, again_b = _rollout(3, [-1.0, -2.0]), _rollout(3, [-1.0, -2.0])
    assert torch.equal(restored.of(again_a), torch.tensor([-0.75, -1.5]))
    assert torch.equal(restored.of(again_b), torch.tensor([-0.75, -1.5]))
    # a second checkpoint holds each sampler value once
    assert len(restored.state_dict()["sampler"]) == 1


def test_bf16_sampler_logprobs_refreshed_to_the_learners(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():  # sharper logits than the random init, so bf16 rounding shows
        model.lm_head.weight.mul_(8)
    gen = HFGenerator(model, char_tokenizer, 16, policy_version=4, dtype=torch.bfloat16)
    torch.manual_seed(0)
    samples = gen.generate(["1+2=", "34+5="], 4, SamplingParams(max_new_tokens=6))
    rollouts = [_rollout(4, [0.0]) for _ in samples]
    for r, s in zip(rollouts, samples, strict=True):
        r.prompt_ids, r.completion_ids, r.behaviour_logprobs = (
            s.prompt_ids,
            s.completion_ids,
            s.logprobs,
        )
    pad = char_tokenizer.pad_token_id

    def recompute(rs):
        b = collate(rs, pad)
        with torch.no_grad():
            lp, _ = token_logprobs(model, b, 1.0)
        return unpad(lp, b.mask)

    table = PiOld()
    stats = _refresh(rollouts, 4, table, recompute)
    assert stats["behaviour_mismatch_max"] > 1e-3  # bf16 sampling differs from the fp32 learner
    # afterwards the learner's ratio on fresh data is 1 to fp32 accuracy
    b = collate(rollouts, pad, [table.of(r) for r in rollouts])
    with torch.no_grad():
        lp, _ = token_logprobs(model, b, 1.0)
    m = b.mask.bool()
    assert float((lp - b.old_logprobs)[m].abs().max()) < 1e-5


def test_learner_autocast_step_refreshes_fresh_behaviour_logprobs(tiny_model, char_tokenizer):
    """Wiring: with learner_autocast=bfloat16 the learner recomputes log pi_old of fresh
    rollouts in bf16 itself, so its first on-policy update sees ratios of 1."""
    import numpy as np

    from replayrl.learner.learner import Learner

    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    gen = HFGenerator(model, char_tokenizer, 16)
    torch.manual_seed(5)
    samples = gen.generate(["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5))
    rollouts = []
    for i, s in enumerate(samples):
        r = _rollout(0, [0.0])
        r.prompt_ids, r.completion_ids, r.behaviour_logprobs = (
            s.prompt_ids,
            s.completion_ids,
            s.logprobs,
        )
        r.advantage = 1.0 if i % 2 else -1.0
        rollouts.append(r)
    pad = char_tokenizer.pad_token_id
    for refresh, expect_unit in (("never", False), ("auto", True)):
        cfg = load_config(
            None,
            [
                "precision.learner_autocast=bfloat16",
                f"precision.recompute_behaviour_logprobs={refresh}",
                "rollout.prompts_per_step=3",
                "rollout.num_generations=4",
            ],
        )
        batch = [copy.deepcopy(r) for r in rollouts]
        learner = Learner(copy.deepcopy(model), pad, cfg)
        m = learner.train_step(batch, np.random.default_rng(0))
        if expect_unit:
            assert m["behaviour_refreshed"] == len(batch)
            assert m["behaviour_mismatch_max"] > 1e-3  # fp32 sampler vs bf16 learner
            assert m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
            assert all(learner.pi_old.refreshed(r) for r in batch)
            for r, orig in zip(batch, rollouts, strict=True):  # the sampler's, unchanged
                assert torch.equal(r.behaviour_logprobs, orig.behaviour_logprobs)
        else:
            assert "behaviour_refreshed" not in m
            assert m["ratio_max"] > 1.001  # the bf16 learner disagrees with the fp32 sampler


# -- precision: auto ----------------------------------------------------------
BIG = 135_000_000  # SmolLM2-135M's parameter count: above BF16_MIN_PARAMS
NATIVE = {"model": "Test Xeon", "flags": ["avx512_bf16", "avx512f", "amx_bf16"]}
EMULATED = {"model": "Old Xeon", "flags": ["avx512f", "avx512_vnni"]}


@pytest.fixture
def hw(monkeypatch, tmp_path):
    """A fake CPU and a fake timed self-check (counted), with a cache under tmp_path."""
    monkeypatch.setenv("REPLAYRL_CACHE", str(tmp_path))
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    state = {"cpu": NATIVE, "timing": (900.0, 150.0), "timed": 0}

    def fake_time():
        state["timed"] += 1
        return state["timing"]

    monkeypatch.setattr(precision, "cpu_info", lambda: state["cpu"])
    monkeypatch.setattr(precision, "_time_bf16", fake_time)
    return state


def _auto(n_params: int = BIG, dtype: torch.dtype = torch.float32) -> precision.PrecisionChoice:
    return precision.choose("auto", "auto", dtype, n_params)


def test_auto_picks_bf16_where_native_and_caches_the_check(hw, tmp_path):
    choice = _auto()
    assert choice.generation == torch.bfloat16 and choice.learner_autocast == torch.bfloat16
    assert choice.reason.startswith("auto -> bf16") and "900 vs fp32 150" in choice.reason
    assert hw["timed"] == 1
    cache = json.loads((tmp_path / "precision.json").read_text())
    (key,) = cache
    assert key.startswith("Test Xeon|") and torch.__version__ in key
    assert cache[key]["bf16_gflops"] == 900.0
    # second call (as a second process would): the cached result, no timing
    hw["timing"] = (1.0, 1000.0)  # would say fp32 if it were timed again
    again = _auto()
    assert hw["timed"] == 1 and again.generation == torch.bfloat16
    assert again.reason.endswith("[cached]")
    assert again.as_dict() == {
        "generation": "bfloat16",
        "learner_autocast": "bfloat16",
        "reason": again.reason,
    }


def test_auto_fp32_when_bf16_is_emulated_or_too_slow(hw, tmp_path):
    hw["cpu"] = EMULATED  # flags pre-filter: no timing at all
    choice = _auto()
    assert choice.generation is None and choice.learner_autocast is None
    assert "emulated" in choice.reason and hw["timed"] == 0
    assert choice.as_dict()["learner_autocast"] == "none"
    hw["cpu"] = NATIVE
    hw["timing"] = (180.0, 150.0)  # 1.2x < BF16_MIN_SPEEDUP
    assert _auto().generation is None and hw["timed"] == 1
    # a damaged cache is measured again and rewritten, never trusted
    (tmp_path / "precision.json").write_text("{not json")
    hw["timing"] = (900.0, 150.0)
    assert _auto().generation == torch.bfloat16 and hw["timed"] == 2
    assert json.loads((tmp_path / "precision.json").read_text())


def test_auto_env_override_small_models_and_fixed_settings(hw, monkeypatch):
    monkeypatch.setenv(precision.ENV_OVERRIDE, "0")
    assert _auto().generation is None and "REPLAYRL_BF16=0" in _auto().reason
    monkeypatch.setenv(precision.ENV_OVERRIDE, "1")
    assert _auto().learner_autocast == torch.bfloat16
    assert hw["timed"] == 0
    # a tiny model or non-fp32 weights stay as they are whatever the hardware
    assert _auto(n_params=400_000).generation is None
    assert _auto(dtype=torch.bfloat16).learner_autocast is None
    # explicit settings are kept; only the `auto` one follows the hardware
    fixed = precision.choose("float32", "none", torch.float32, BIG)
    assert fixed.generation is None and fixed.learner_autocast is None
    assert fixed.reason == "as configured"
    mixed = precision.choose("auto", "none", torch.float32, BIG)
    assert mixed.generation == torch.bfloat16 and mixed.learner_autocast is None


def test_run_summary_records_the_precision_choice(monkeypatch, tmp_path):
    """A tiny run with the self-check forced to bf16 (and the size gate lowered): the choice
    is printed at start, kept in summary.json, and the learner refreshes log pi_old."""
    monkeypatch.setenv(precision.ENV_OVERRIDE, "1")
    monkeypatch.setattr(precision, "BF16_MIN_PARAMS", 0)
    cfg = tiny_config(tmp_path / "run", "train.steps=1", "model.warmstart.steps=0")
    lines: list[str] = []
    summary = train(cfg, log=lines.append)
    assert summary["precision"]["generation"] == "bfloat16"
    assert summary["precision"]["learner_autocast"] == "bfloat16"
    assert "REPLAYRL_BF16=1" in summary["precision"]["reason"]
    run_dir = Path(summary["run_dir"])
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == summary["precision"]
    assert any(line.startswith("precision: generation bfloat16") for line in lines)


def test_learner_and_generator_follow_the_auto_choice(monkeypatch, tiny_model, char_tokenizer):
    from replayrl.learner.learner import Learner
    from replayrl.rollout.generation import make_generator

    monkeypatch.setattr(precision, "BF16_MIN_PARAMS", 0)
    pad = char_tokenizer.pad_token_id
    for forced, dtype in (("1", torch.bfloat16), ("0", None)):
        monkeypatch.setenv(precision.ENV_OVERRIDE, forced)
        cfg = load_config(None, [])  # precision auto (the default)
        learner = Learner(copy.deepcopy(tiny_model), pad, cfg)
        assert learner.autocast == dtype
        assert learner.recompute_behaviour == (dtype is not None)  # bf16 needs the refresh
        gen = make_generator(cfg, tiny_model, char_tokenizer, "")
        assert gen.dtype == dtype  # type: ignore[attr-defined]
