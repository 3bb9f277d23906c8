"""Method presets hold the method only; the demo experiment is a layer of its own, and a real
model gets TRL's defaults (config/layering.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from replayrl.api.config import ReplayConfig
from replayrl.cli.main import main
from replayrl.config import catalog
from replayrl.config.layering import EXPERIMENT_KEYS, is_method, resolve
from replayrl.config.schema import ConfigError, load_config

METHODS = [
    "ar3po",
    "dapo",
    "exgrpo",
    "group-replay",
    "grpo",
    "ppo",
    "remix-grpo",
    "remix-ppo",
    "replay",
    "repo",
]
# what the demo decides, never a method preset
DEMO_KEYS = {("rollout", "max_new_tokens"), ("rollout", "temperature"), ("train", "lr")}


def _preset(name: str) -> dict:
    return yaml.safe_load(catalog.resolve_preset(name).read_text())


@pytest.mark.parametrize("name", METHODS)
def test_method_presets_hold_only_method_keys(name: str) -> None:
    data = _preset(name)
    assert is_method(data), f"{name} sets {[k for k in EXPERIMENT_KEYS if k in data]}"
    for section, key in DEMO_KEYS:
        assert key not in (data.get(section) or {}), f"{name} sets {section}.{key}"


@pytest.mark.parametrize("name", ["replay", "grpo", "remix-grpo", "dapo"])
def test_api_method_preset_with_a_real_model_keeps_trl_defaults(name: str) -> None:
    # as ReplayTrainer(model="path", args=ReplayConfig(name)) resolves it
    args = ReplayConfig(name)
    cfg = args.to_config({"model.path": "/models/any"})
    args.resolved = cfg
    assert args.max_completion_length == 512
    assert args.learning_rate == 1e-6
    assert args.per_device_train_batch_size == 8
    assert args.lr_scheduler_type == "linear"
    assert cfg.task.name == "arithmetic" and cfg.rollout.max_new_tokens == 512


def test_api_model_object_is_a_real_model() -> None:
    args = ReplayConfig("replay")
    args.real_model = True  # what ReplayTrainer sets for a PreTrainedModel object
    assert args.to_config().rollout.max_new_tokens == 512


def test_api_method_preset_with_the_tiny_model_is_the_demo() -> None:
    from replayrl.api.trainer import ReplayTrainer

    args = ReplayConfig("replay")
    # before a trainer, args read as the run goes with a model of your own
    assert (args.max_completion_length, args.learning_rate) == (512, 1e-6)
    ReplayTrainer(args=args, log=lambda _: None)  # model=None: the built-in tiny model
    assert args.max_completion_length == 6
    assert args.learning_rate == 1e-4
    assert args.per_device_train_batch_size == 128  # B = 2 R, one update per step


def test_user_values_win_over_trl_defaults_and_method() -> None:
    args = ReplayConfig("replay", learning_rate=3e-6, max_completion_length=64)
    cfg = args.to_config({"model.path": "/models/any"})
    assert (cfg.train.lr, cfg.rollout.max_new_tokens) == (3e-6, 64)
    assert cfg.method_spec.buffer == "replay" and cfg.rollout.prompts_per_step == 8  # the method


def test_cli_method_preset_with_model_path_keeps_trl_defaults(capsys) -> None:
    cfg = load_config("replay", ["model.path=/models/any"])
    assert cfg.rollout.max_new_tokens == 512
    assert cfg.train.lr == 1e-6
    assert cfg.train.mini_batch_size == 8
    assert cfg.method_spec.buffer == "replay"
    assert main(["config", "show", "--config", "replay", "model.path=/models/any"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["rollout"]["max_new_tokens"] == 512 and shown["train"]["lr"] == 1e-6


@pytest.mark.parametrize("name", METHODS)
def test_tiny_model_gets_the_demo_layer_and_by_name_the_same(name: str) -> None:
    auto = load_config(name)
    named = load_config(f"{name}+demo")
    assert auto == named
    assert auto.rollout.max_new_tokens == 6 and auto.train.lr == 1e-4
    assert auto.task.name == "arithmetic" and auto.model.path is None


def test_demo_layer_by_name_under_a_real_model_still_applies() -> None:
    cfg = load_config("replay+demo", ["model.path=/models/any"])
    assert cfg.rollout.max_new_tokens == 6 and cfg.train.lr == 1e-4


def test_whole_experiment_presets_get_no_layer() -> None:
    # smollm2-gsm sets its own model and task: nothing is put under it
    data, sources = resolve("smollm2-gsm")
    assert data["train"]["lr"] == 5e-4 and sources["train.lr"] == "experiment"
    assert "rollout.max_new_tokens" not in {k for k, s in sources.items() if s != "experiment"}


def test_user_file_gets_no_layer(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("method: {name: onpolicy}\n")
    cfg = load_config(str(path))
    assert cfg.rollout.max_new_tokens == 8  # the schema's default, not the demo's 6
    assert resolve(str(path))[1]["method.name"] == "file"


def test_unknown_layer_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="experiments: demo"):
        load_config("replay+nosuch")


def _sources(capsys, *argv: str) -> dict[str, str]:
    """`config show --sources` as {key: source}."""
    assert main(["config", "show", "--sources", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split()[0]: line.rsplit("  ", 1)[1].strip() for line in lines}


def test_config_show_sources(capsys) -> None:
    rows = _sources(capsys, "--config", "replay", "train.steps=3")
    assert rows["train.steps"] == "command line"
    assert rows["method.name"] == "method"
    assert rows["rollout.max_new_tokens"] == "experiment"
    assert rows["train.seed"] == "default"
    rows = _sources(capsys, "-c", "replay", "model.path=/m")
    assert rows["train.lr"] == "default (TRL)"
    assert rows["model.path"] == "command line"


@pytest.mark.parametrize("name", ["smollm2-gsm", "vllm"])
def test_shipped_data_and_reward_files_are_found_from_any_folder(
    name: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replayrl.rollout.rewards import resolve_rewards

    monkeypatch.chdir(tmp_path)  # no checkout here: nothing repository-relative resolves
    cfg = load_config(name)
    assert Path(cfg.task.settings.path).is_file() and Path(cfg.task.settings.path).is_absolute()
    refs = [(r.name, r.weight) for r in cfg.rewards]
    assert any(n.endswith("answer_format.py:final_answer_format") for n, _ in refs)
    fns = resolve_rewards(refs)
    scores = fns[1].fn(["q"], ["so the answer is 4."])
    assert scores == [1.0]
