"""benchmarks/rollout_waste.py: from a run's metrics.jsonl and full completions.jsonl, the
shares of generated rollouts in all-correct and all-wrong groups, the tokens never trained with
a non-zero advantage, and the signal per generated token with reuse counted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "rollout_waste", ROOT / "benchmarks" / "rollout_waste.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["rollout_waste"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def _rec(
    step, group, completion, reward, adv, tokens, origin="fresh", trained=True, version=0, age=None
):
    rec = {
        "step": step,
        "prompt": f"p{group}",
        "completion": completion,
        "reward": reward,
        "advantage": adv,
        "correct": reward > 0,
        "trained": trained,
        "origin": origin,
        "policy_version": version,
        "completion_tokens": tokens,
        "group": group,
    }
    return rec if age is None else rec | {"age": age}


def _write_run(folder: Path) -> None:
    """Two steps of 4 rollouts (groups of 2), 10 tokens each.

    Step 1: group 0 all wrong, group 1 mixed (+1 / -1). Step 2: group 0 all right, group 1
    all wrong and not trained (dropped); the batch replays step 1's mixed group's correct
    rollout twice over (2 passes of 3 distinct rollouts: 60 trained tokens)."""
    folder.mkdir()
    metrics = [
        {"step": 0, "eval/accuracy": 0.1},
        {
            "step": 1,
            "rollouts_generated": 4,
            "tokens_generated": 40,
            "tokens_trained": 40,
            "batch/age_mean": 0.0,
            "train/ess": 1.0,
            "train/on_policy/tokens": 40,
            "train/off_policy/tokens": 0,
        },
        {
            "step": 2,
            "rollouts_generated": 8,
            "tokens_generated": 80,
            "tokens_trained": 100,
            "batch/age_mean": 0.5,
            "train/ess": 0.8,
            "train/on_policy/tokens": 40,
            "train/off_policy/tokens": 20,
        },
    ]
    comps = [
        _rec(1, 0, "a", 0.0, 0.0, 10),
        _rec(1, 0, "b", 0.0, 0.0, 10),
        _rec(1, 1, "c", 1.0, 1.0, 10),
        _rec(1, 1, "d", 0.0, -1.0, 10),
        _rec(2, 0, "e", 1.0, 0.0, 10, version=1),
        _rec(2, 0, "f", 1.0, 0.0, 10, version=1),
        _rec(2, 1, "g", 0.0, 0.0, 10, trained=False, version=1),
        _rec(2, 1, "h", 0.0, 0.0, 10, trained=False, version=1),
        _rec(2, 1, "c", 1.0, 1.0, 10, origin="replayed"),
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    (folder / "completions.jsonl").write_text("\n".join(json.dumps(c) for c in comps) + "\n")


def test_shares_signal_and_never_used_tokens_by_quarter(tmp_path: Path) -> None:
    tool = _tool()
    _write_run(tmp_path / "run")
    res = tool.analyse_run(tmp_path / "run")
    whole = res["all"]
    assert whole["rollouts"] == 8 and whole["tokens"] == 80
    assert whole["all_wrong_rollouts"] == 4 / 8  # step 1's group 0, step 2's group 1
    assert whole["all_right_rollouts"] == 2 / 8
    assert whole["zero_adv_rollouts"] == 6 / 8
    # only c and d were ever trained with a non-zero advantage
    assert whole["never_used_tokens"] == 60 / 80
    # step 1: 20 signal tokens, 1 pass; step 2: 60 trained over 30 logged = 2 passes, c's 10
    assert whole["fresh_signal_per_token"] == 20 / 80
    assert whole["replayed_signal_per_token"] == 20 / 80
    assert whole["signal_per_token"] == 40 / 80
    assert whole["trained_per_token"] == 100 / 80
    assert whole["staleness"] == 0.25 and whole["ess"] == 0.9
    assert whole["replayed"] == (0.0 + 20 / 60) / 2
    assert whole["replayed_zero_adv"] == 0.0  # the replayed c had signal
    # step 1 ends at half the rollouts: the 2nd quarter; step 2 at all of them: the 4th
    q = res["quarters"]
    assert q[0]["rollouts"] == 0 and q[0]["zero_adv_rollouts"] is None
    assert q[1]["all_wrong_rollouts"] == 0.5 and q[1]["signal_per_token"] == 0.5
    assert q[3]["all_right_rollouts"] == 0.5 and q[3]["never_used_tokens"] == 1.0


def test_main_writes_table_json_and_figure(tmp_path: Path, capsys) -> None:
    tool = _tool()
    _write_run(tmp_path / "run")
    out = tmp_path / "w.png"
    rc = tool.main(
        [
            "--run",
            f"t/m={tmp_path / 'run'}",
            f"t/absent={tmp_path / 'none'}",
            "--json",
            str(tmp_path / "w.json"),
            "--markdown",
            str(tmp_path / "w.md"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert (
        "left out: ['t/absent']" in text and "| t | m | all | 75% (25% / 50%) | 75% | 0% |" in text
    )
    assert json.loads((tmp_path / "w.json").read_text())["t"]["m"]["all"]["rollouts"] == 8
    assert (tmp_path / "w.md").read_text().startswith("| task |")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_rollouts_of_the_step_logged_as_replayed_and_unlogged_ones_count_as_generated(
    tmp_path: Path,
) -> None:
    """AR3PO's earlier rounds reach the log through the batch (origin "replayed", age 0):
    they are this step's generation; rollouts the log never shows (DAPO's dropped later
    calls) count as generated and never used."""
    tool = _tool()
    folder = tmp_path / "run"
    folder.mkdir()
    metrics = [{"step": 1, "rollouts_generated": 6, "tokens_generated": 60, "tokens_trained": 40}]
    comps = [
        _rec(1, 0, "a", 0.0, 0.0, 10, age=0),
        _rec(1, 0, "b", 0.0, 0.0, 10, origin="replayed", age=0),  # an earlier round
        _rec(1, 1, "c", 1.0, 1.0, 10, age=0),
        _rec(1, 1, "d", 0.0, -1.0, 10, origin="replayed", age=0),
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    (folder / "completions.jsonl").write_text("\n".join(json.dumps(c) for c in comps) + "\n")
    res = tool.analyse_run(folder, screen=1)
    assert "screening" not in res  # the log misses rollouts: no counterfactual from it
    whole = res["all"]
    assert whole["all_wrong_rollouts"] == 2 / 6 and whole["all_right_rollouts"] == 0
    assert whole["unlogged_rollouts"] == 2 / 6
    assert whole["never_used_tokens"] == 40 / 60  # a, b and the 20 unlogged tokens
    assert whole["fresh_signal_per_token"] == 20 / 60 and whole["replayed_signal_per_token"] == 0


def test_screening_counterfactual_saves_agreeing_groups_and_counts_signal_lost() -> None:
    """Groups of 4 screened at 2: a group whose first two agree stops there (2 saved); one of
    the stopped groups had variance later (a signal group lost)."""
    tool = _tool()
    outcomes = {0: [0, 0, 0, 0], 1: [0, 0, 1, 0], 2: [1, 0, 0, 0], 3: [1, 1, 1, 1]}
    comps = [
        _rec(4, g, f"{g}{i}", float(r), 0.0, 10, age=0)
        for g, rs in outcomes.items()
        for i, r in enumerate(rs)
    ]
    q = tool.screening(comps, 2)
    assert [x["groups"] for x in q] == [0, 0, 0, 4]
    last = q[3]
    assert last["saved"] == 6 / 16  # groups 0, 1, 3 stop after two
    assert last["signal_lost"] == 1 / 2  # group 1 (group 2 disagreed at once: kept)
    assert last["signal_per_rollout"] == 2 / 16
    assert last["screened_signal_per_rollout"] == 1 / 10
    # groups of different sizes (AR3PO's rounds): no counterfactual
    assert tool.screening([*comps, _rec(4, 9, "x", 0.0, 0.0, 10, age=0)], 2) == []
