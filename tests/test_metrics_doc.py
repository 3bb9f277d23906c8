"""docs/metrics.md is generated from run/metric_keys.py and current; every key that short
GRPO, replay, ReMix and PPO runs log is in the catalogue (scripts/gen_metrics_doc.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from replayrl.api.trl_compat import TRL_LOG_KEYS
from replayrl.config.registries import METHODS
from replayrl.run import metric_keys
from replayrl.run.metrics import read_metrics
from replayrl.run.start import train
from scripts_loader import load_script
from tiny import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def _gen():
    return load_script("gen_metrics_doc")


@pytest.fixture(scope="module")
def logged_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Every key each preset's 2-step tiny run (with one evaluation) writes."""
    out = {}
    for preset in ("grpo", "replay", "remix-grpo", "ppo"):
        root = tmp_path_factory.mktemp(preset)
        cfg = tiny_config(root, "train.steps=2", "eval.every=2", "logging.name=r", config=preset)
        train(cfg, log=lambda _: None)
        out[preset] = {k for r in read_metrics(root / "r" / "metrics.jsonl") for k in r}
    return out


def test_committed_metrics_page_matches_the_code() -> None:
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == _gen().render(), "run: python scripts/gen_metrics_doc.py"


def test_every_key_short_runs_log_is_documented(logged_keys: dict[str, set[str]]) -> None:
    for preset, keys in logged_keys.items():
        missing = sorted(k for k in keys if metric_keys.entry_for(k) is None)
        assert not missing, f"{preset} logs undocumented keys (run/metric_keys.py): {missing}"
    # the runs differ where the methods do: PPO's value head, ReMix's KL to the base model
    assert "train/value_loss" in logged_keys["ppo"] - logged_keys["grpo"]
    assert "train/kl_to_base" in logged_keys["remix-grpo"] - logged_keys["grpo"]
    assert "reward/correctness" in logged_keys["grpo"] and "eval/accuracy" in logged_keys["grpo"]


def test_an_undocumented_key_is_caught() -> None:
    assert metric_keys.entry_for("train/brand_new_statistic") is None
    assert metric_keys.entry_for("batch/age_mean_x") is None
    assert metric_keys.entry_for("train/on_policy/ess").key.startswith("train/<on_policy")
    assert metric_keys.entry_for("reward/my_reward").trl == "rewards/<name>/mean"
    assert metric_keys.entry_for("eval/pass@8").key == "eval/pass@<k>"


def test_trl_names_agree_with_the_trainer_and_exist_in_trl() -> None:
    by_key = {m.key: m for m in metric_keys.CATALOGUE}
    for ours, theirs in TRL_LOG_KEYS.items():
        if ours in by_key:  # what ReplayTrainer's log_history calls it is what the page says
            assert by_key[ours].trl == theirs, ours
    trl = pytest.importorskip("trl")
    source = (Path(trl.__file__).parent / "trainer" / "grpo_trainer.py").read_text()
    logged = set(re.findall(r'_metrics\[mode\]\["([^"]+)"\]', source))
    logged |= {"rewards/<name>/mean", "rewards/<name>/std"}  # f-strings
    logged |= {"loss", "learning_rate", "grad_norm"}  # transformers' Trainer
    # evaluation: TRL's eval mode and transformers' evaluate() prefix every name with eval_
    logged |= {f"eval_{k}" for k in (*logged, "accuracy")}
    for m in metric_keys.CATALOGUE:
        if m.trl:
            assert m.trl in logged, f"{m.key}: TRL logs no {m.trl!r}"


def test_every_batch_source_counter_has_a_meaning_on_the_page() -> None:
    text = _gen().render()
    for name, spec in METHODS.items():
        for counter in spec.metrics:
            assert counter.meaning, f"{name}: {counter.name} has no meaning"
            assert f"| `{name}` | `{counter.name}` | " in text
            assert f" | {counter.meaning} |" in text


def test_the_page_names_where_summary_json_reports_each_counter() -> None:
    """The page's key for each counter is one a run's summary.json has (`generation_rounds`
    is reported as `generation_rounds_extra`; filtered and discarded rollouts only as ledger
    terms), and the count it holds there."""
    from replayrl.config.schema import load_config
    from replayrl.run.state import Counters, summarize

    text = _gen().render()
    c = Counters()
    counters = {m.name: m for _, spec in METHODS.items() for m in spec.metrics}
    for i, name in enumerate(sorted(counters), start=1):
        c.add(name, i)
    run = dict(policy_version=0, num_eval_prompts=0, run_dir="x", num_parameters=1)
    summary = summarize(load_config("grpo"), c, [], model_path="m", **run)
    for source, spec in METHODS.items():
        for m in spec.metrics:
            paths = [] if m.reported_as is None else [m.reported_as]
            paths += [] if m.ledger is None else [f"accounting.ledger.{m.ledger[0]}"]
            where = ", ".join(f"`{p}`" for p in paths)
            assert paths and f"| `{source}` | `{m.name}` | {where} |" in text, m.name
            for path in paths:
                value: object = summary
                for part in path.split("."):
                    assert isinstance(value, dict) and part in value, (m.name, path)
                    value = value[part]
                assert value == c.count(m.name), (m.name, path)
