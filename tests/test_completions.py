"""The completions log: which rollouts it records, as what, and that a run writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.data.rollout_record import Rollout
from replayrl.run.completions import (
    FILE,
    CompletionsLog,
    completions_records,
    format_table,
    read_completions,
)
from replayrl.run.start import train
from tiny import TINY_RUN


def rollout(group: int, reward: float, version: int = 3, text: str = "12") -> Rollout:
    return Rollout(
        prompt_ids=torch.tensor([1, 2]),
        completion_ids=torch.tensor([3, 4, 5]),
        behaviour_logprobs=torch.zeros(3),
        reward=reward,
        advantage=reward - 0.5,
        correct=reward > 0.5,
        group_id=group,
        policy_version=version,
        step=version,
        completion_text=text,
        prompt_text=f"prompt {group}",
        extras={"rewards": {"correctness": reward, "fmt": 0.25}},
    )


def test_records_spread_over_prompts_and_mark_origin_and_training():
    fresh = [rollout(g, float(i % 2)) for g in (0, 1, 2) for i in range(2)]
    old = [rollout(9, 1.0, version=1), rollout(9, 0.0, version=1)]
    batch = [fresh[0], fresh[2], *old]  # trained: two fresh ones and the two replayed ones
    recs = completions_records(7, fresh, batch, version=3, n=4)
    assert len(recs) == 4
    fresh_recs = [r for r in recs if r["origin"] == "fresh"]
    replayed = [r for r in recs if r["origin"] == "replayed"]
    # half replayed at most; the fresh half takes one completion from each of two prompts
    assert len(replayed) == 2 and len(fresh_recs) == 2
    assert {r["prompt"] for r in fresh_recs} == {"prompt 0", "prompt 1"}
    assert all(r["age"] == 2 and r["trained"] for r in replayed)
    assert [r["trained"] for r in fresh_recs] == [True, True]  # fresh[0], fresh[2]
    first = fresh_recs[0]
    assert first["rewards"] == {"correctness": 0.0, "fmt": 0.25}
    assert first["advantage"] == -0.5 and first["age"] == 0 and first["step"] == 7
    assert first["completion_tokens"] == 3


def test_untrained_fresh_rollouts_are_marked_so():
    fresh = [rollout(0, 1.0), rollout(0, 0.0)]
    recs = completions_records(1, fresh, [], version=3, n=8)
    assert len(recs) == 2 and not any(r["trained"] for r in recs)
    assert completions_records(1, fresh, fresh, version=3, n=0) == []


def test_log_writes_due_steps_only_and_prints_a_table(tmp_path: Path):
    printed: list[str] = []
    log = CompletionsLog(tmp_path, n=2, every=5, printer=printed.append)
    fresh = [rollout(0, 1.0, text="line one\nline two")]
    assert [log.log(s, fresh, fresh, 3) for s in (1, 2, 5, 6, 10)] == [1, 0, 1, 0, 1]
    recs = read_completions(tmp_path / FILE)
    assert [r["step"] for r in recs] == [1, 5, 10]
    assert recs[0]["completion"] == "line one\nline two"  # whole in the file
    assert len(printed) == 3 and "line one⏎line two" in printed[0]
    assert "fresh" in printed[0] and "yes" in printed[0]


def test_resume_drops_records_after_the_checkpoint(tmp_path: Path):
    log = CompletionsLog(tmp_path, n=1, every=1)
    for s in (1, 2, 3):
        log.log(s, [rollout(0, 1.0)], [], 3)
    CompletionsLog(tmp_path, n=1, every=1, resume_step=2)
    assert [r["step"] for r in read_completions(tmp_path / FILE)] == [1, 2]


def test_format_table_handles_missing_values():
    text = format_table([{"prompt": "p", "completion": "c", "reward": None, "advantage": None}])
    assert "p -> c" in text


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "train.steps=3",
            "train.threads=1",
            "logging.completions=3",
            "logging.completions_every=2",
            "logging.tensorboard=true",
            f"logging.run_dir={root}",
            "logging.name=c",
        ],
    )
    said: list[str] = []
    train(cfg, log=said.append)
    (root / "said.txt").write_text("\n".join(said))
    return root / "c"


def test_a_run_writes_readable_completions_from_the_first_step(logged_run: Path):
    lines = (logged_run / FILE).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2]  # step 1, then every 2 steps
    for r in recs:
        assert isinstance(r["completion"], str) and r["prompt"]
        assert set(r["rewards"]) == {"correctness"}  # the default reward, by its name
        assert r["rewards"]["correctness"] == r["reward"]  # weight 1: combined = its own
        assert r["origin"] == "fresh" and r["trained"]  # on-policy: all fresh, all trained


def test_a_run_writes_the_completions_table_to_tensorboard(logged_run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logged_run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert any(t.startswith("completions") for t in tags), tags


def test_completions_zero_turns_the_log_off(tmp_path: Path):
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "train.steps=1",
            "train.threads=1",
            "logging.completions=0",
            f"logging.run_dir={tmp_path}",
            "logging.name=nolog",
        ],
    )
    train(cfg, log=lambda _: None)
    assert (tmp_path / "nolog" / "metrics.jsonl").is_file()
    assert not (tmp_path / "nolog" / FILE).exists()


def test_trl_log_completions_and_count_map_to_the_key():
    from replayrl.api.config import ReplayConfig
    from replayrl.config.schema import ConfigError

    assert ReplayConfig(log_completions=False).to_config().logging.completions == 0
    on = ReplayConfig(log_completions=True, num_completions_to_print=7).to_config()
    assert on.logging.completions == 7
    assert ReplayConfig(learning_rate=1e-5).to_config().logging.completions == 4  # default on
    with pytest.raises(ConfigError, match="num_completions_to_print"):
        ReplayConfig(num_completions_to_print=-1).to_config()


def test_a_sync_run_says_what_wall_seconds_covers_and_no_mu(logged_run: Path):
    from replayrl.run.records.ledger import format_accounting

    said = (logged_run.parent / "said.txt").read_text()
    assert "accounting (seconds busy / idle" in said and "measured mu" not in said
    summary = json.loads((logged_run / "summary.json").read_text())
    assert "evaluations and checkpoints are not in it" in summary["wall_seconds_covers"]
    acc = summary["accounting"]
    if acc["mu"] is not None:  # an async run or `auto` shows it, with what it means
        shown = format_accounting(acc["ledger"], acc, show_mu=True)
        assert "generating a rollout took" in shown
