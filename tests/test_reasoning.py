"""The written-out reasoning task family: traces, verifier, seeded split, mistaken teacher."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from replayrl.config.overrides import ConfigError
from replayrl.config.schema import load_config
from replayrl.rollout.rewards.builtin import final_answer, final_answer_reward
from replayrl.rollout.tasks import task_from_config
from replayrl.rollout.tasks.reasoning import (
    ALPHABET,
    ReasoningTask,
    add_trace,
    chain_trace,
    sub_trace,
)
from replayrl.run.warmstart import ensure_warmstart, warmstart_key


def test_traces_show_the_working_and_end_with_the_answer() -> None:
    assert add_trace(47, 586, explicit=False, error_rate=0, rng=None) == (
        "7+6=13,r3;4+8+1=13,r33;5+1=6,r633;#633",
        633,
    )
    assert add_trace(47, 586, explicit=True, error_rate=0, rng=None)[0] == (
        "7+6+0=13,r3;4+8+1=13,r33;0+5+1=6,r633;#633"
    )
    assert add_trace(95, 7, explicit=False, error_rate=0, rng=None)[0] == (
        "5+7=12,r2;9+1=10,r02;1=1,r102;#102"
    )
    assert sub_trace(503, 47, explicit=False, error_rate=0, rng=None) == (
        "13-7=6,r6;10-4-1=5,r56;5-1=4,r456;#456",
        456,
    )
    assert chain_trace(38, [("+", 7), ("-", 19)], error_rate=0, rng=None) == (
        "38+7=45;45-19=26;#26",
        26,
    )


@pytest.mark.parametrize("op", ["add", "sub", "chain"])
def test_correct_teacher_is_always_right_and_traces_vary_in_length(op: str) -> None:
    task = ReasoningTask(op, digits=3, min_digits=1, terms=4, eval_size=50, seed=0)
    rng = np.random.default_rng(0)
    rows = task.sample_train(300, rng)
    for i, row in enumerate(rows):
        assert task.is_correct(task.trace(row, explicit=bool(i % 2)), row)
    lengths = [len(c) for _, c in task.sft_pairs(300, rng, 0.0)]
    assert max(lengths) - min(lengths) >= 10
    # the same row solved correctly in two styles: a short and a longer correct trace
    if op != "chain":
        short, long = task.trace(rows[0]), task.trace(rows[0], explicit=True)
        assert task.is_correct(short, rows[0]) and task.is_correct(long, rows[0])
        assert len(long) >= len(short)


@pytest.mark.parametrize("op", ["add", "sub", "chain"])
def test_mistaken_teacher_forgets_carries_sometimes(op: str) -> None:
    task = ReasoningTask(op, digits=3, min_digits=2, eval_size=50, seed=0)
    rows = task.sample_train(400, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    acc = [
        np.mean([task.is_correct(task.trace(r, error_rate=e, rng=rng), r) for r in rows])
        for e in (0.0, 0.5, 1.0)
    ]
    assert acc[0] == 1.0 and 0.0 < acc[2] < acc[1] < 1.0  # realistic and fixable
    pairs = task.sft_pairs(20, rng, 0.5)
    assert all(p.endswith("=") and "#" in c for p, c in pairs)


def test_eval_split_is_seeded_and_never_trained_on() -> None:
    a = ReasoningTask("add", digits=2, eval_size=100, seed=4)
    assert a.eval_rows() == ReasoningTask("add", digits=2, eval_size=100, seed=4).eval_rows()
    assert a.eval_rows() != ReasoningTask("add", digits=2, eval_size=100, seed=5).eval_rows()
    held = {r["prompt"] for r in a.eval_rows()}
    assert len(held) == 100
    assert not held & {r["prompt"] for r in a.sample_train(3000, np.random.default_rng(0))}


def test_verifier_and_reward_read_the_number_after_the_last_mark() -> None:
    row = {"answer": "633"}
    task = ReasoningTask("add", digits=3, eval_size=10)
    assert task.is_correct("7+6=13,r3;#633", row)
    assert task.is_correct("#12;#0633", row)  # leading zeros dropped, last mark wins
    assert not task.is_correct("7+6=13,r633", row)  # no final answer: wrong
    assert not task.is_correct("#633;", row)
    assert final_answer("x#") is None
    assert final_answer_reward(["p", "p"], ["..;#633", "..;#634"], ["633", "633"]) == [1.0, 0.0]


def test_bad_knobs_are_clear_errors_and_config_builds_the_task() -> None:
    with pytest.raises(ValueError, match="task.reasoning.op"):
        ReasoningTask("mul")
    with pytest.raises(ValueError, match="min_digits"):
        ReasoningTask("add", digits=2, min_digits=3)
    with pytest.raises(ValueError, match="eval_size"):
        ReasoningTask("add", digits=1, eval_size=60)
    # the config refuses what the task cannot build, before any warm start or run starts
    with pytest.raises(ConfigError, match="task.reasoning.digits"):
        load_config("configs/reasoning-add.yaml", ["task.reasoning.digits=7"])
    cfg = load_config("configs/reasoning-add.yaml")
    task = task_from_config(cfg.task)
    assert isinstance(task, ReasoningTask) and task.op == "add" and task.digits == 3
    rows = task.eval_rows()
    lengths = [len(task.trace(r)) + 1 for r in rows]  # + EOS
    assert statistics.median(lengths) >= 30
    assert max(lengths) <= cfg.rollout.max_new_tokens


def test_arithmetic_warmstart_key_is_unchanged_by_the_new_task_fields() -> None:
    """Existing configs keep their cached warm starts: the key hashes the same fields."""
    import hashlib
    import json

    cfg = load_config("configs/demo.yaml")
    payload = json.dumps(
        {
            "tiny": cfg.model.tiny.model_dump(),
            "warmstart": cfg.model.warmstart.model_dump(),
            "task": {"name": "arithmetic", "digits": 2, "eval_size": 200, "seed": 0},
            "format": 2,
        },
        sort_keys=True,
    )
    assert warmstart_key(cfg.model, cfg.task) == hashlib.sha256(payload.encode()).hexdigest()[:16]
    # a common setting outside arithmetic's list leaves its key; a reasoning knob changes a
    # reasoning task's key
    other = cfg.task.model_copy(update={"system_prompt": "Add."})
    assert warmstart_key(cfg.model, other) == warmstart_key(cfg.model, cfg.task)
    r = load_config("configs/reasoning-add.yaml")
    sub = r.task.model_copy(update={"reasoning": r.task.settings.model_copy(update={"op": "sub"})})
    assert warmstart_key(r.model, sub) != warmstart_key(r.model, r.task)


def test_tiny_warm_start_refuses_arithmetic_digits_it_cannot_start() -> None:
    cfg = load_config(None, ["task.arithmetic.digits=3"])
    with pytest.raises(ValueError, match=r"task.arithmetic.digits=3.*task.name=reasoning"):
        ensure_warmstart(cfg.model, cfg.task, log=lambda _: None)


def test_reasoning_warm_start_trains_on_the_tasks_own_teacher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The generalised warm start: phase 1 on the task's correct traces, phase 2 on its
    mistaken teacher at model.warmstart.teacher_carry_error; the tokenizer covers the task."""
    from transformers import AutoTokenizer

    calls: list[tuple[int, float]] = []
    real = ReasoningTask.sft_pairs

    def spy(self, n, rng, error_rate):
        calls.append((n, error_rate))
        return real(self, n, rng, error_rate)

    monkeypatch.setattr(ReasoningTask, "sft_pairs", spy)
    cfg = load_config(
        "configs/reasoning-chain.yaml",
        [
            "model.tiny.num_layers=1",
            "model.tiny.hidden_size=32",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            "model.warmstart.steps=3",
            "model.warmstart.mistake_steps=2",
            "model.warmstart.batch_size=4",
        ],
    )
    path = ensure_warmstart(cfg.model, cfg.task, log=lambda _: None)
    assert calls == [(4, 0.0)] * 3 + [(4, 0.5)] * 2
    assert set(ALPHABET) <= set(AutoTokenizer.from_pretrained(path).get_vocab())
    calls.clear()
    assert ensure_warmstart(cfg.model, cfg.task, log=lambda _: None) == path  # cached
    assert calls == []


def test_chain_rows_are_arrow_friendly_and_traces_follow_the_prompt() -> None:
    import re

    task = ReasoningTask("chain", digits=1, terms=6, eval_size=20, seed=1)
    rows = task.sample_train(400, np.random.default_rng(0))
    assert all(isinstance(r["ops"], str) for r in rows)
    assert any("-0" in r["prompt"] for r in rows)  # the case a signed-int encoding would lose
    for r in rows:
        trace = task.trace(r)
        assert task.is_correct(trace, r)
        # each step applies the prompt's own operations, in order (`-0` stays `-0`)
        steps = [re.fullmatch(r"\d+([+-]\d+)=\d+", s).group(1) for s in trace.split(";")[:-1]]
        assert steps == re.findall(r"[+-]\d+", r["prompt"])
