"""The arithmetic task: seeded train/eval split, rows, verifier, carry-forgetting teacher."""

from __future__ import annotations

import numpy as np
import pytest

from replayrl.rollout.tasks import ArithmeticTask, make_task
from replayrl.rollout.tasks.arithmetic import add_with_carry_errors


def _pairs(rows):
    return {(r["a"], r["b"]) for r in rows}


def test_train_rows_never_in_eval_split():
    # 1 digit: 100 problems, 40 held out -> training draws only from the other 60
    task = ArithmeticTask(digits=1, eval_size=40, seed=3)
    eval_pairs = _pairs(task.eval_rows())
    assert len(eval_pairs) == 40
    train = task.sample_train(2000, np.random.default_rng(0))
    assert len(train) == 2000
    train_pairs = _pairs(train)
    assert not train_pairs & eval_pairs
    assert len(train_pairs) == 60  # and every non-held-out problem does come up
    # same for the default 2-digit task
    task2 = ArithmeticTask(digits=2, eval_size=200, seed=0)
    assert not _pairs(task2.sample_train(3000, np.random.default_rng(1))) & _pairs(
        task2.eval_rows()
    )


def test_eval_split_is_deterministic_for_a_seed():
    a = ArithmeticTask(digits=2, eval_size=50, seed=7).eval_rows()
    b = ArithmeticTask(digits=2, eval_size=50, seed=7).eval_rows()
    c = ArithmeticTask(digits=2, eval_size=50, seed=8).eval_rows()
    assert a == b
    assert _pairs(a) != _pairs(c)
    assert len(_pairs(a)) == 50  # distinct problems
    assert all(0 <= r["a"] < 100 and 0 <= r["b"] < 100 for r in a)


def test_train_sampling_is_deterministic_for_an_rng_seed():
    task = ArithmeticTask(digits=3, eval_size=10)
    assert task.sample_train(20, np.random.default_rng(4)) == task.sample_train(
        20, np.random.default_rng(4)
    )


def test_rows_and_verifier():
    row = ArithmeticTask.make_row(58, 67)
    assert row == {"prompt": "58+67=", "answer": "125", "a": 58, "b": 67}
    task = ArithmeticTask(digits=2, eval_size=10)
    assert task.is_correct("125", row)
    assert task.is_correct(" 125 ", row)
    assert not task.is_correct("15", row)
    assert not task.is_correct("1250", row)
    assert set("".join(task.corpus())) >= set("0123456789+=")


def test_eval_size_must_be_under_half_the_problems():
    with pytest.raises(ValueError, match="eval_size=50"):
        ArithmeticTask(digits=1, eval_size=50)  # 100 problems in all
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=0)


def test_make_task():
    assert isinstance(make_task("arithmetic", digits=1, eval_size=5, seed=0), ArithmeticTask)
    with pytest.raises(ValueError, match="'multiplication'"):
        make_task("multiplication")


def test_carry_error_zero_is_exact_addition():
    rng = np.random.default_rng(0)
    for a, b in np.random.default_rng(1).integers(0, 10**5, size=(300, 2)):
        assert add_with_carry_errors(int(a), int(b), 0.0, rng) == a + b


def test_carry_error_one_drops_every_carry():
    rng = np.random.default_rng(0)
    # 58 + 67: units 8 + 7 = 15 -> write 5, carry 1 dropped; tens 5 + 6 = 11 -> write 1, carry
    # dropped; nothing left -> "15" (the correct sum is 125)
    assert add_with_carry_errors(58, 67, 1.0, rng) == 15
    # 99 + 1: 9 + 1 = 10 -> 0, carry dropped; 9 + 0 = 9 -> 90
    assert add_with_carry_errors(99, 1, 1.0, rng) == 90
    # 999 + 999: every column 9 + 9 = 18 -> 8, carry dropped -> 888
    assert add_with_carry_errors(999, 999, 1.0, rng) == 888
    # no carries anywhere: unaffected
    assert add_with_carry_errors(12, 34, 1.0, rng) == 46
    assert add_with_carry_errors(0, 0, 1.0, rng) == 0


def test_sft_pairs_follow_the_teacher():
    task = ArithmeticTask(digits=2, eval_size=10)
    exact = task.sft_pairs(50, np.random.default_rng(0), carry_error=0.0)
    for prompt, completion in exact:
        a, b = prompt.rstrip("=").split("+")
        assert completion == str(int(a) + int(b))
    sloppy = task.sft_pairs(200, np.random.default_rng(0), carry_error=1.0)
    wrong = 0
    for prompt, completion in sloppy:
        a, b = (int(x) for x in prompt.rstrip("=").split("+"))
        # digit-wise sum mod 10, column by column, is exactly "every carry dropped"
        assert int(completion) == (a % 10 + b % 10) % 10 + 10 * ((a // 10 + b // 10) % 10)
        wrong += int(completion) != a + b
    assert wrong > 50  # carries occur in ~half of 2-digit sums, and all were forgotten
