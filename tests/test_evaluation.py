"""Held-out evaluation (greedy pass@1, pass@k) with a scripted generator, and metric sinks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.rollout.evaluation import evaluate, evaluate_policy, held_out_rows, pass_at_k
from replayrl.rollout.generation import Sample, SamplingParams
from replayrl.rollout.tasks import ArithmeticTask
from replayrl.run.metrics import MetricsLogger, read_metrics


class ScriptedGenerator:
    """Returns fixed completion texts: greedy -> `greedy[i]`, sampled -> `sampled[i][j]`."""

    policy_version = 0

    def __init__(self, greedy: list[str], sampled: list[list[str]] | None = None) -> None:
        self.greedy, self.sampled = greedy, sampled or []
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts, num_samples, params):
        self.calls.append((num_samples, params))
        out = []
        for i in range(len(prompts)):
            texts = [self.greedy[i]] if params.greedy else self.sampled[i][:num_samples]
            for text in texts:
                ids = torch.ones(len(text) + 1, dtype=torch.long)  # text + EOS
                out.append(Sample(i, torch.ones(3), ids, torch.zeros(len(ids)), text, False, 0))
        return out


ROWS = [ArithmeticTask.make_row(a, b) for a, b in [(1, 2), (20, 22), (58, 67), (5, 5)]]


def test_pass_at_k_by_hand():
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)=3, C(4,2)=6
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2)=3, C(5,2)=10
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: every k-subset has a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n


def test_greedy_accuracy_and_length():
    # answers 3, 42, 125, 10; two of the four greedy completions are right
    gen = ScriptedGenerator(greedy=["3", "41", " 125 ", "1"])
    res = evaluate(gen, ArithmeticTask(), ROWS, max_new_tokens=6)
    assert res["eval/accuracy"] == pytest.approx(0.5)
    # token counts are len(text) + 1: 2, 3, 6, 2 -> mean 3.25
    assert res["eval/completion_length"] == pytest.approx(3.25)
    assert set(res) == {"eval/accuracy", "eval/completion_length"}  # no pass@k when k <= 1
    ((n, params),) = gen.calls
    assert n == 1
    assert params.greedy
    assert params.max_new_tokens == 6


def test_pass_at_k_with_k_samples_per_prompt():
    # k = 3 samples per prompt: prompts 0 and 2 have a correct one, 1 and 3 do not -> 0.5
    gen = ScriptedGenerator(
        greedy=["0", "0", "0", "0"],
        sampled=[["3", "4", "5"], ["1", "2", "3"], ["15", "125", "125"], ["11", "01", "9"]],
    )
    res = evaluate(gen, ArithmeticTask(), ROWS, max_new_tokens=6, pass_k=3, temperature=0.6)
    assert res["eval/accuracy"] == 0.0
    assert res["eval/pass@3"] == pytest.approx(0.5)
    n, params = gen.calls[1]
    assert n == 3
    assert not params.greedy
    assert params.temperature == 0.6


def test_metrics_logger_writes_jsonl_with_nan_as_null(tmp_path: Path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"a": 1.5, "b": float("nan"), "c": float("inf")})
    logger.log(2, {"a": 2.0})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "a": 1.5, "b": None, "c": None},
        {"step": 2, "a": 2.0},
    ]
    # resume from step 2 appends; a fresh logger truncates
    logger = MetricsLogger(tmp_path, tensorboard=False, resume_step=2)
    logger.log(3, {"a": 3.0})
    logger.close()
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    # resume from step 1 (a crash after step 3 was logged): steps 2 and 3 are dropped first
    logger = MetricsLogger(tmp_path, tensorboard=False, resume_step=1)
    logger.log(2, {"a": 20.0})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "a": 1.5, "b": None, "c": None},
        {"step": 2, "a": 20.0},
    ]
    MetricsLogger(tmp_path, tensorboard=False).close()
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_evaluate_policy_takes_every_setting_from_the_config() -> None:
    cfg = load_config(
        None,
        ["rollout.max_new_tokens=7", "eval.pass_k=3", "eval.temperature=0.6", "eval.num_prompts=2"],
    )

    class Task(ArithmeticTask):
        def eval_rows(self):
            return ROWS

    task = Task()
    rows = held_out_rows(cfg, task)
    assert rows == ROWS[:2]
    gen = ScriptedGenerator(["3", "0"], [["3", "1", "3"], ["42", "42", "0"]])
    res = evaluate_policy(cfg, gen, task, rows, render=lambda p: f"<{p}>")
    (n1, greedy), (k, sampled) = gen.calls
    assert (n1, greedy.greedy, greedy.max_new_tokens) == (1, True, 7)
    assert (k, sampled.temperature, sampled.max_new_tokens) == (3, 0.6, 7)
    assert res["eval/accuracy"] == 0.5 and res["eval/pass@3"] == 1.0


def test_every_caller_evaluates_through_evaluate_policy() -> None:
    # the session, the generator worker (sharded learners evaluate on it), the API, the CLI
    # and the TRL peer: one function, so that a peer is never measured differently from our runs
    src = Path(__file__).resolve().parent.parent / "src" / "replayrl"
    direct = []
    for path in src.rglob("*.py"):
        if path.name == "evaluation.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "replayrl.rollout.evaluation":
                direct += [f"{path.name}: {a.name}" for a in node.names if a.name == "evaluate"]
    assert direct == []
    users = {p.name for p in src.rglob("*.py") if "evaluate_policy(" in p.read_text()} - {
        "evaluation.py"
    }
    assert users == {"session.py", "worker.py", "trainer.py", "evaluate.py", "trl_grpo.py"}
