"""What an API run records so that config.yaml replays it: reward names, dataset copies."""

from __future__ import annotations

import json
import math

import numpy as np

from replayrl.api.replayable import (
    NOT_REPLAYABLE,
    jsonl_copy,
    metric_name,
    reward_record,
    why_not_importable,
)
from replayrl.rollout.rewards import REWARDS
from replayrl.rollout.rewards.loading import load_reward_function


def exact(prompts, completions, answer, **kw):
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def correctness(prompts, completions, **kw):
    return [0.0 for _ in completions]


def test_a_module_level_function_is_recorded_by_a_name_that_loads_it_back():
    spec = reward_record(exact, "exact")
    assert spec.endswith(":exact") and why_not_importable(exact) is None
    assert load_reward_function(spec) is exact


def test_lambdas_local_functions_and_objects_say_why_they_cannot_be_replayed():
    def local(prompts, completions, **kw):
        return [0.0] * len(completions)

    class Scorer:
        def __call__(self, prompts, completions, **kw):
            return [0.0] * len(completions)

    assert why_not_importable(lambda p, c, **k: c) == "it is a lambda"
    assert why_not_importable(local) == "it is defined inside another function"
    assert "callable object of class Scorer" in str(why_not_importable(Scorer()))
    main_fn = type(exact)(exact.__code__, {}, "main_fn")
    main_fn.__module__ = "__main__"
    assert "__main__" in str(why_not_importable(main_fn))
    text = reward_record(local, "local")
    assert text.startswith(NOT_REPLAYABLE) and "inside another function" in text
    assert ":" not in text  # a ':' would read as code to run on resume


def test_a_user_reward_never_takes_a_builtin_name():
    assert "correctness" in REWARDS
    assert metric_name(correctness, 0, frozenset(REWARDS)) == "user_correctness"
    assert metric_name(exact, 0, frozenset(REWARDS)) == "exact"
    assert metric_name(lambda p, c: c, 3, frozenset(REWARDS)) == "reward_3"


def test_jsonl_copy_writes_numpy_values_as_numbers_and_nan_as_null():
    rows = [{"prompt": "1+1=", "answer": np.int64(2), "w": math.nan, "v": np.arange(2)}]
    text, why = jsonl_copy(rows)
    assert why == "" and text is not None
    assert [json.loads(line) for line in text.splitlines()] == [
        {"prompt": "1+1=", "answer": 2, "w": None, "v": [0, 1]}
    ]
    text, why = jsonl_copy([{"prompt": "x", "blob": object()}])
    assert text is None and "object" in why
