"""Each kind of plug-in is one module plus one registration: a backend, a runtime, a sampler
and a reward registered here (as an installed package would, see tests/test_registry.py) are
accepted by the config and used by a run, with no edit to a central module."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from replayrl.config.registries import BACKENDS, BackendSpec
from replayrl.config.schema import ConfigError, load_config
from tiny import tiny_config


@pytest.fixture
def recording_backend():
    """`recorded`: the hf backend, but with its own kernels and a truncated-IS default."""
    from replayrl.rollout.generation.backends import build_hf

    built: list[str] = []

    def build(cfg: Any, model: Any, tokenizer: Any, model_path: str, **kw: Any) -> Any:
        built.append(model_path)
        return build_hf(cfg, model, tokenizer, model_path, **kw)

    BACKENDS.add(
        "recorded",
        BackendSpec(build, own_logprobs=True, truncated_is_cap=lambda cfg: 1.5, summary="test"),
    )
    yield built
    BACKENDS.remove("recorded")


def test_a_plugin_backend_is_validated_and_sets_what_the_learner_asks(
    recording_backend, tiny_model, char_tokenizer
) -> None:
    from replayrl.learner.learner import Learner

    with pytest.raises(ConfigError, match=r"unknown generation backend 'recordd'.*did you mean"):
        load_config(None, ["rollout.backend=recordd"])
    cfg = load_config(
        None, ["rollout.backend=recorded", "precision.recompute_behaviour_logprobs=auto"]
    )
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, cfg)
    # its log-probs are not the learner's: log pi_old recomputed, its own IS default applies
    assert learner.recompute_behaviour and learner.tis_cap == 1.5
    hf = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, load_config(None))
    assert hf.tis_cap is None


def test_a_plugin_backend_generates_a_tiny_run(recording_backend, tmp_path: Path) -> None:
    from replayrl.run.start import train

    summary = train(
        tiny_config(tmp_path, "rollout.backend=recorded", "train.steps=1"), log=lambda _: None
    )
    assert recording_backend and summary["rollouts_generated"] == 8 and summary["steps"] == 1


@pytest.fixture
def twin_runtimes():
    """`recorded_sync`: the synchronous loop, recording its start; `detached`: a runtime
    whose generators run beside the learner (never started here)."""
    from replayrl.config.registries import RUNTIMES, RuntimeSpec
    from replayrl.run.runtimes import start_sync

    started: list[str] = []

    def start(cfg: Any, run_dir: Path, log: Any, resume: bool, hooks: Any = None) -> Any:
        started.append(cfg.runtime)
        return start_sync(cfg, run_dir, log, resume, hooks)

    RUNTIMES.add("recorded_sync", RuntimeSpec(start, lockstep=True, hooks=True, summary="t"))
    RUNTIMES.add("detached", RuntimeSpec(start, summary="test"))
    yield started
    RUNTIMES.remove("recorded_sync")
    RUNTIMES.remove("detached")


def test_a_plugin_runtime_is_checked_by_what_it_supports(twin_runtimes) -> None:
    with pytest.raises(ConfigError, match=r"unknown runtime 'recorded_snc'.*did you mean"):
        load_config(None, ["runtime=recorded_snc"])
    load_config(None, ["runtime=recorded_sync", "train.rollout_budget=64"])
    with pytest.raises(ConfigError, match=r"train.rollout_budget needs runtime=recorded_sync or"):
        load_config(None, ["runtime=detached", "train.rollout_budget=64"])
    with pytest.raises(
        ConfigError, match=r"method.name=ar3po needs runtime=recorded_sync or runtime=sync"
    ):
        load_config("ar3po", ["runtime=detached"])
    with pytest.raises(ConfigError, match=r"workers.learners > 1 needs runtime=ray"):
        load_config(None, ["runtime=detached", "workers.learners=2"])
    from replayrl.run.state import Counters, accounting

    # its generators run beside the learner: the accounting counts all of them
    cfg = load_config(None, ["runtime=detached", "workers.generators=3"])
    assert accounting(cfg, Counters(), [])["workers"] == 3
    cfg = load_config(None, ["runtime=recorded_sync", "workers.generators=3"])
    assert accounting(cfg, Counters(), [])["workers"] == 1


def test_a_plugin_runtime_runs_a_tiny_run(twin_runtimes, tmp_path: Path) -> None:
    from replayrl.run.start import train

    cfg = tiny_config(tmp_path, "runtime=recorded_sync", "train.steps=1")
    summary = train(cfg, log=lambda _: None)
    assert twin_runtimes == ["recorded_sync"] and summary["steps"] == 1


class _HalfReserve:
    """Keeps half the buffer for rewarded rollouts, whatever delta is."""

    name = "half_reserve"
    delta = 0.0

    def reserve_capacity(self, capacity: int) -> int:
        return capacity // 2


@pytest.fixture
def half_reserve():
    from replayrl.config.registries import SAMPLERS, SamplerSpec

    SAMPLERS.add("half_reserve", SamplerSpec(lambda delta: _HalfReserve(), summary="test"))
    yield
    SAMPLERS.remove("half_reserve")


REPLAY = [
    "method.name=replay",
    "buffer.capacity=16",
    "buffer.sampler=half_reserve",
    "train.batch_size=8",
]


def test_a_plugin_sampler_sizes_the_buffer(half_reserve) -> None:
    from replayrl.data.buffer import make_buffer
    from replayrl.run.components import buffer_kwargs

    with pytest.raises(ConfigError, match=r"unknown sampler 'half_reserv'.*did you mean"):
        load_config(
            None, ["method.name=replay", "buffer.capacity=16", "buffer.sampler=half_reserv"]
        )
    cfg = load_config(None, REPLAY)
    buffer = make_buffer("replay", 16, **buffer_kwargs(cfg))
    assert (
        isinstance(buffer.sampler, _HalfReserve)
        and buffer.state_dict()["sampler"] == "half_reserve"
    )
    assert buffer._reserve.cap == 8 and buffer._fresh.cap == 8  # a window and a reserve
    with pytest.raises(ValueError, match="delta=0.5: not used by sampler='half_reserve'"):
        make_buffer("replay", 16, sampler="half_reserve", delta=0.5)
    with pytest.raises(ValueError, match="kind='onpolicy'"):
        make_buffer("onpolicy", 16, sampler="half_reserve")


def test_a_plugin_sampler_trains_a_tiny_run(half_reserve, tmp_path: Path) -> None:
    from replayrl.run.start import train

    summary = train(tiny_config(tmp_path, *REPLAY, "train.steps=2"), log=lambda _: None)
    assert summary["steps"] == 2 and summary["rollouts_generated"] == 16


def test_a_plugin_reward_is_named_in_the_config_and_scores_a_tiny_run(tmp_path: Path) -> None:
    from replayrl.config.registries import REWARDS
    from replayrl.run.start import train

    scored: list[int] = []

    def length_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        scored.append(len(completions))
        return [float(len(c) % 2) for c in completions]

    REWARDS.add("odd_length", length_reward)
    try:
        with pytest.raises(ConfigError, match=r"unknown reward function 'odd_lenght'.*did you"):
            load_config(None, ["rewards=[{name: odd_lenght}]"])
        rewards = "rewards=[{name: correctness}, {name: odd_length, weight: 0.5}]"
        cfg = tiny_config(tmp_path, rewards, "train.steps=1")
        assert [r.name for r in cfg.rewards] == ["correctness", "odd_length"]
        summary = train(cfg, log=lambda _: None)
    finally:
        REWARDS.remove("odd_length")
    assert summary["steps"] == 1 and sum(scored) == 8  # every rollout of the step scored


SHIFTED_SUM_PLUGIN = """
from pydantic import Field

from replayrl.config.registries import TASKS, TaskSpec
from replayrl.config.section import Section
from replayrl.rollout.tasks import ArithmeticTask

BUILT = []


class ShiftedSumConfig(Section):
    shift: int = Field(0, ge=0, description="added to every sum")
    digits: int = Field(1, ge=1, le=2)


class ShiftedSum(ArithmeticTask):
    name = "shifted_sum"

    def __init__(self, shift=0, **kw):
        self.shift = shift
        super().__init__(**kw)

    def make_row(self, a, b):
        return {"prompt": f"{a}+{b}+{self.shift}=", "answer": str(a + b + self.shift),
                "a": a, "b": b}


def build(t):
    s = t.settings
    BUILT.append((s.shift, s.digits))
    return ShiftedSum(shift=s.shift, digits=s.digits, eval_size=t.eval_size, seed=t.seed)


def register():
    TASKS.add("shifted_sum", TaskSpec(build, ShiftedSum, summary="a+b+shift",
                                      config=ShiftedSumConfig))
"""


@pytest.fixture
def shifted_sum_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An installed package (an entry point) that adds a task with its own settings."""
    import sys

    from replayrl.config.registries import TASKS
    from replayrl.registry import PLUGIN_GROUP, reset_plugins

    root = tmp_path / "site"
    root.mkdir()
    (root / "shifted_sum_plugin.py").write_text(SHIFTED_SUM_PLUGIN)
    info = root / "shifted_sum_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shifted-sum\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{PLUGIN_GROUP}]\nshifted = shifted_sum_plugin:register\n"
    )
    monkeypatch.syspath_prepend(str(root))
    reset_plugins()
    yield
    TASKS.remove("shifted_sum")
    sys.modules.pop("shifted_sum_plugin", None)
    reset_plugins()


def test_a_plugin_task_brings_its_own_settings_section(shifted_sum_plugin) -> None:
    cfg = load_config(None, ["task.name=shifted_sum", "task.shifted_sum.shift=3"])
    assert cfg.task.settings.shift == 3 and cfg.task.settings.digits == 1
    with pytest.raises(ConfigError, match=r"task.shifted_sum.shift: Input should be greater"):
        load_config(None, ["task.name=shifted_sum", "task.shifted_sum.shift=-1"])
    # its setting while another task is selected names its section
    with pytest.raises(ConfigError, match=r"task.shifted_sum.shift: a setting of task.name=shif"):
        load_config(None, ["task.shifted_sum.shift=3"])


def test_a_plugin_task_is_configured_and_trained_from_the_cli(
    shifted_sum_plugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import yaml

    from replayrl.cli.main import main
    from tiny import TINY_RUN

    keys = ["task.name=shifted_sum", "task.shifted_sum.shift=7", "task.shifted_sum.digits=2"]
    assert main(["config", "show", *keys]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["task"]["shifted_sum"] == {"shift": 7, "digits": 2}
    run = [*TINY_RUN, "train.steps=1", f"logging.run_dir={tmp_path}", "logging.name=p"]
    assert main(["train", *keys, *run]) == 0
    assert (7, 2) in sys.modules["shifted_sum_plugin"].BUILT  # the run's task had them
    saved = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())
    assert saved["task"]["shifted_sum"] == {"shift": 7, "digits": 2}
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["steps"] == 1
