"""Math answer extraction, the grader (math_verify and the fallback), math rewards, and
reward functions loaded from user files."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayrl.rollout.rewards.loading import RewardLoadError, load_reward_function
from replayrl.rollout.rewards.math import (
    _math_verify_match,
    answer_tag_format_reward,
    answers_match,
    boxed_format_reward,
    extract_answer,
    fallback_match,
    last_boxed,
    math_reward,
)
from replayrl.rollout.rewards.scoring import WeightedReward, score

# --- extraction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{1} first, then \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # the last box wins
        ("\\boxed{\\sqrt{\\frac{a}{b}}} end", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed{3} then a cut-off \\boxed{4", "3"),  # an unclosed box is not an answer
        ("empty \\boxed{} then 7", "7"),
        ("\\fbox{12}", "12"),
        ("\\boxed 5 done", "5"),
        ("She pays 5-3=2 dollars.\n#### 1,234", "1234"),  # after ####, separators dropped
        ("#### 72\nsome trailing words 9", "72"),
        ("so 5-3=2.", "2"),  # `-3` inside `5-3` is not a negative number
        ("x = -7.", "-7"),
        ("it is \u22123", "-3"),  # unicode minus
        ("total: 1,234,567 apples", "1234567"),
        ("it is 3/4, I think", "3/4"),
        ("so \\frac{3}{4}", "3/4"),
        ("pi is about 3.14.", "3.14"),
        ("no digits at all", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_answer(text: str | None, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_last_boxed_needs_balanced_braces() -> None:
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert last_boxed("\\boxed{a{b}c") is None
    assert last_boxed("no box") is None


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_extract_answer_reads_thousands_separators(n: int) -> None:
    assert extract_answer(f"after some work, {n:,} is the total") == str(n)


# --- grading: both with math_verify and with the fallback ------------------------------


@pytest.fixture(params=["math_verify", "fallback"])
def grader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "math_verify":
        pytest.importorskip("math_verify")
    else:
        monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` fails
    return request.param


EQUAL = [
    ("0.75", "\\frac{3}{4}"),
    ("3/4", "0.75"),
    ("\\frac{3}{4}", "3/4"),
    ("\\dfrac{1}{2}", "0.5"),
    ("-\\frac{1}{2}", "-0.5"),
    ("5 cm", "5"),
    ("5\\text{ cm}", "5"),
    ("5 dollars", "5"),
    ("$5", "5"),
    ("\\$5.00", "5"),
    ("-3", "\u22123"),
    ("1,234", "1234"),
    ("1,234,567", "1234567"),
    ("72", "72.0"),
    ("x = 5", "5"),
    ("50\\%", "50"),
]
DIFFERENT = [
    ("73", "72"),
    ("3/4", "0.76"),
    ("-3", "3"),
    ("1234", "123"),
    ("2x", "2"),  # a variable is not a unit
    ("5 pi", "5"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1,2", "12"),  # not a thousands separator
]


@pytest.mark.parametrize(("pred", "gold"), EQUAL)
def test_answers_match_equivalent_forms(grader: str, pred: str, gold: str) -> None:
    assert answers_match(pred, gold) is True
    assert answers_match(gold, pred) is True


@pytest.mark.parametrize(("pred", "gold"), DIFFERENT)
def test_answers_match_rejects_wrong_answers(grader: str, pred: str, gold: str) -> None:
    assert answers_match(pred, gold) is False


@pytest.mark.parametrize(("pred", "gold"), [(None, "5"), ("", "5"), ("5", None), ("5", "")])
def test_answers_match_missing_sides(grader: str, pred: str | None, gold: str | None) -> None:
    assert answers_match(pred, gold) is False


def test_grader_modes_differ_only_where_expected(grader: str) -> None:
    # symbolic equivalence needs math_verify; the fallback does not claim it
    symbolic = [("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("(x+1)^2", "x^2+2x+1")]
    for pred, gold in symbolic:
        assert answers_match(pred, gold) is (grader == "math_verify")
    if grader == "fallback":
        assert _math_verify_match("0.75", "\\frac{3}{4}") is None
    else:
        # math_verify alone (not via the fallback) handles the fraction forms
        assert _math_verify_match("0.75", "\\frac{3}{4}") is True
        assert _math_verify_match("\\frac{1}{2}", "0.5") is True
        assert _math_verify_match("73", "72") is False


def test_fallback_is_exact_on_numbers() -> None:
    assert fallback_match("0.3333", "1/3") is False  # exact rationals, no rounding
    assert fallback_match("0.1", "1/10") is True
    assert fallback_match("\\text{(B)}", "B") is True  # multiple-choice letter
    assert fallback_match("1/0", "1/0") is True  # not a number: compared as text


def test_math_verify_grading_works_off_the_main_thread() -> None:
    pytest.importorskip("math_verify")
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(answers_match("(x+1)^2", "x^2+2x+1")))
    t.start()
    t.join(timeout=30)
    assert out == [True]  # signal.alarm would raise in a thread: the timeout is turned off


# --- rewards with TRL's signature -------------------------------------------------------


def test_math_reward_trl_signature(grader: str) -> None:
    prompts = ["p1", "p2", "p3", "p4", "p5"]
    completions = [
        "Half of it: \\boxed{\\frac{1}{2}}",
        "I get 71",
        "whatever 3",
        [{"role": "assistant", "content": "So the total is 1,234."}],  # conversational
        "#### 72",
    ]
    answer = ["0.5", "72", None, "1234", "Natalia sold 48/2 = 24 ... #### 72"]
    out = math_reward(prompts=prompts, completions=completions, answer=answer, level=[1] * 5)
    assert out == [1.0, 0.0, None, 1.0, 1.0]


def test_math_reward_inside_weighted_scoring() -> None:
    rows = [{"prompt": "q", "answer": "4"}, {"prompt": "q", "answer": "4"}]
    fns = [
        WeightedReward("math", math_reward, 1.0),
        WeightedReward("boxed", boxed_format_reward, 0.5),
    ]
    result = score(fns, ["q", "q"], ["\\boxed{4}", "4 or 5? 5"], rows)
    assert result.errors == 0
    assert result.rewards == [1.5, 0.0]


def test_format_rewards() -> None:
    completions = [
        "so \\boxed{7}",
        "\\boxed{}",
        "\\boxed{7",
        "<answer>7</answer>",
        "<answer>\n 7 \n</answer> trailing",
        "<answer> </answer>",
        "<answer>7",
    ]
    assert boxed_format_reward(prompts=[""] * 7, completions=completions) == [
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
    assert answer_tag_format_reward(prompts=[""] * 7, completions=completions) == [
        0.0,
        0.0,
        0.0,
        1.0,
        1.0,
        0.0,
        0.0,
    ]


# --- loading user reward functions ------------------------------------------------------

USER_FILE = """
from dataclasses import dataclass

THRESHOLD = 3

@dataclass
class Helper:
    bonus: float = 0.5

def length_reward(prompts, completions, answer, **kwargs):
    return [Helper().bonus + float(len(c) <= THRESHOLD and c == a)
            for c, a in zip(completions, answer)]
"""


def test_load_reward_function_from_file(tmp_path) -> None:
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_FILE)
    fn = load_reward_function(f"{path}:length_reward")
    out = fn(prompts=["a", "b"], completions=["12", "1234"], answer=["12", "1234"], extra=[0, 0])
    assert out == [1.5, 0.5]
    # the same file again gives the same function (imported once)
    assert load_reward_function(f"{path}:length_reward") is fn


def test_load_reward_function_relative_to_base_dir(tmp_path) -> None:
    (tmp_path / "rw.py").write_text(USER_FILE)
    fn = load_reward_function("rw.py:length_reward", base_dir=tmp_path)
    assert fn(prompts=["p"], completions=["ab"], answer=["ab"]) == [1.5]


def test_load_reward_function_from_module() -> None:
    assert load_reward_function("replayrl.rollout.rewards.math:math_reward") is math_reward


def test_load_reward_function_errors(tmp_path) -> None:
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_FILE)
    missing = tmp_path / "nope.py"
    with pytest.raises(RewardLoadError, match="file not found") as err:
        load_reward_function(f"{missing}:f")
    assert str(missing) in str(err.value)
    with pytest.raises(RewardLoadError, match="no attribute 'nope'") as err:
        load_reward_function(f"{path}:nope")
    assert f"{path}:nope" in str(err.value) and "length_reward" in str(err.value)
    with pytest.raises(RewardLoadError, match="not a callable"):
        load_reward_function(f"{path}:THRESHOLD")
    with pytest.raises(RewardLoadError, match="expected 'path/to/file.py:function_name'"):
        load_reward_function("just_a_name")
    with pytest.raises(RewardLoadError, match="both the module"):
        load_reward_function(f"{path}:")
    with pytest.raises(RewardLoadError, match="module 'no_such_pkg_xyz.mod' not found"):
        load_reward_function("no_such_pkg_xyz.mod:f")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(RewardLoadError, match="importing .*broken.py failed: SyntaxError"):
        load_reward_function(f"{broken}:f")
    assert issubclass(RewardLoadError, ValueError)
