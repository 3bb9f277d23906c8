"""Reuse methods and tasks are registry entries: the config accepts what is registered, the run
builds what the registry names, and no central module dispatches on a method's name."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from replayrl.config.registries import (
    METHODS,
    TASKS,
    MethodSpec,
    SourceCounter,
    TaskSpec,
)
from replayrl.config.schema import ConfigError, load_config
from replayrl.config.section import Section
from replayrl.data.buffer import OnPolicyQueue
from replayrl.methods.buffer import BufferSource
from replayrl.methods.remix import RemixSource
from replayrl.run.components import build_batch_source
from replayrl.run.state import Counters

PKG = Path(__file__).resolve().parent.parent / "src" / "replayrl"


def _name_dispatch(source: str, names: set[str]) -> list[str]:
    """`x == "<name>"` / `x != "<name>"` / `x in ("<name>", ...)` comparisons on `names`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for comp in node.comparators:
            consts = [comp] if isinstance(comp, ast.Constant) else []
            if isinstance(comp, ast.Tuple | ast.List | ast.Set):
                consts = [e for e in comp.elts if isinstance(e, ast.Constant)]
            found += [c.value for c in consts if c.value in names]
    return found


def test_the_name_dispatch_check_sees_a_dispatch() -> None:
    src = 'if cfg.method.name == "ar3po":\n    pass\nif t.name in ("dataset", "x"):\n    pass'
    assert _name_dispatch(src, {"ar3po", "dataset"}) == ["ar3po", "dataset"]
    assert _name_dispatch('if a == "other":\n    pass', {"ar3po"}) == []


# a module may compare against the names it registers itself (its own plug-in's name); the
# reading of older configs' method keys compares against the names those keys selected
OWN_NAMES = {
    "methods/exgrpo.py": {"exgrpo"},
    "config/method_sections.py": {"onpolicy", "replay", "remix"},
}


def test_no_module_dispatches_on_a_plugin_name() -> None:
    """No `== "<name>"` on a backend, runtime, sampler, task, method, policy loss or advantage
    estimator outside its own module: what the code asks of a plug-in is a field of its
    registry entry."""
    from replayrl.algorithms import ADVANTAGES, POLICY_LOSSES
    from replayrl.config.registries import BACKENDS, RUNTIMES, SAMPLERS

    names = set(METHODS) | set(TASKS) | set(BACKENDS) | set(RUNTIMES) | set(SAMPLERS)
    names |= set(POLICY_LOSSES) | set(ADVANTAGES)
    names -= {"none"}  # also a plain word ("none" as a setting's value)
    # also the kinds of buffer (`make_buffer`, `MethodSpec.buffer`): compared as such
    names -= {"onpolicy", "replay"}
    assert {"hf", "vllm", "sync", "ray", "uniform", "positive_bias", "dataset"} <= names
    assert {"remix", "ar3po", "grpo_clip", "mix_ppg", "gae", "rloo"} <= names
    offenders = {
        rel: hits
        for path in PKG.rglob("*.py")
        if (rel := str(path.relative_to(PKG)))
        and (
            hits := [
                h
                for h in _name_dispatch(path.read_text(), names)
                if h not in OWN_NAMES.get(rel, set())
            ]
        )
    }
    assert offenders == {}


def test_the_schema_lists_and_validates_what_the_sources_register() -> None:
    assert {"onpolicy", "replay", "remix", "dynamic_sampling", "group_replay", "ar3po"} <= set(
        METHODS
    )
    cfg = load_config("ar3po", ["method.ar3po.reuse=0"])
    assert cfg.method.ar3po.reuse == 0 and cfg.method.section("ar3po") is cfg.method.ar3po
    with pytest.raises(ConfigError, match=r"method\.ar3po\.max_rounds: Input should be"):
        load_config("ar3po", ["method.ar3po.max_rounds=0"])
    with pytest.raises(ConfigError, match=r"unknown method 'arpo' \(known: .*ar3po"):
        load_config(None, ["method.name=arpo"])
    with pytest.raises(ConfigError, match=r"method\.nope: no method of that name"):
        load_config(None, ["method.nope.x=1"])
    with pytest.raises(ConfigError, match=r"unknown task 'datset' \(known: arithmetic, dataset"):
        load_config(None, ["task.name=datset"])


def test_each_source_declares_metrics_the_run_counts() -> None:
    """Each counter is a source's own (not a run-wide `Counters` field), declared once: a
    name several sources add to means one thing, and no two names share a summary key."""
    fields = {f.name for f in dataclasses.fields(Counters)}
    by_name: dict[str, SourceCounter] = {}
    for name in METHODS:
        spec = METHODS.get(name)
        assert spec.summary, name
        own = set(spec.config.model_fields) if spec.config else set()
        assert {k for k in spec.frozen_on_resume if "." not in k} <= own, name
        for m in spec.metrics:
            assert m.name not in fields and m.meaning, (name, m.name)
            assert by_name.setdefault(m.name, m) == m, (name, m.name)
    keys = [m.reported_as for m in by_name.values() if m.reported_as is not None]
    terms = [m.ledger[0] for m in by_name.values() if m.ledger is not None]
    assert len(keys) == len(set(keys)) and len(terms) == len(set(terms))
    with pytest.raises(TypeError, match="SourceCounter entries"):
        MethodSpec(lambda ctx: None, metrics=("rollouts_echoed",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a ledger term"):
        SourceCounter("rollouts_echoed", "nowhere", summary_key=None)


def test_resume_keys_come_from_the_registry_entry() -> None:
    from replayrl.run.records.folder import check_resume_config

    saved = load_config("repo")
    # RePO's prompt pool is drawn once and its pass order is checkpointed
    with pytest.raises(ConfigError, match=r"method\.repo\.prompt_pool \(the checkpoint has 256"):
        check_resume_config(saved, load_config("repo", ["method.repo.prompt_pool=128"]))
    with pytest.raises(ConfigError, match=r"method\.exgrpo\.store_per_question"):
        check_resume_config(
            load_config("exgrpo"), load_config("exgrpo", ["method.exgrpo.store_per_question=8"])
        )
    check_resume_config(saved, load_config("repo", ["method.repo.strategy=recency"]))
    METHODS.add(
        "echo",
        MethodSpec(lambda ctx: None, _EchoConfig, summary="test", frozen_on_resume=("passes",)),
    )
    try:
        echo = load_config("grpo", ["method.name=echo"])
        with pytest.raises(ConfigError, match=r"method\.echo\.passes"):
            check_resume_config(
                echo, load_config("grpo", ["method.name=echo", "method.echo.passes=1"])
            )
        # another source's frozen key is not this run's concern
        check_resume_config(saved, load_config("repo", ["method.echo.passes=1"]))
    finally:
        METHODS.remove("echo")


def test_a_task_names_its_own_resume_keys() -> None:
    from replayrl.rollout.tasks import ArithmeticConfig, ArithmeticTask
    from replayrl.run.records.folder import check_resume_config

    spec = TaskSpec(
        lambda t: None,
        ArithmeticTask,
        summary="test",
        config=ArithmeticConfig,
        frozen_on_resume=("digits",),  # a name in its own section
    )
    TASKS.add("frozen_digits", spec)
    try:
        saved = load_config(None, ["task.name=frozen_digits"])
        check_resume_config(saved, load_config(None, ["task.name=frozen_digits", "task.seed=3"]))
        with pytest.raises(
            ConfigError, match=r"task\.frozen_digits\.digits \(the checkpoint has 2, now 3\)"
        ):
            check_resume_config(
                saved, load_config(None, ["task.name=frozen_digits", "task.frozen_digits.digits=3"])
            )
        check_resume_config(load_config(None), load_config(None, ["task.arithmetic.digits=3"]))
    finally:
        TASKS.remove("frozen_digits")


def test_a_plugin_sources_counters_reach_the_ledger_and_the_summary() -> None:
    """A source's counter lives in `Counters.source_counts`; a declared ledger term makes the
    ledger balance and is printed in the end-of-run report."""
    from replayrl.run.records.ledger import format_accounting
    from replayrl.run.state import ledger, summarize

    echoed = SourceCounter("rollouts_echoed", "echoed", ledger=("echoed", "echoed away"))
    spec = MethodSpec(lambda ctx: None, metrics=(echoed,), summary="test")
    c = Counters(rollouts_generated=5)
    c.add("rollouts_echoed", 5)
    c.add("rollouts_reused", 2)
    assert c.source_counts == {"rollouts_echoed": 5, "rollouts_reused": 2}
    assert c.count("rollouts_echoed") == 5 and c.count("generation_rounds") == 0
    with pytest.raises(ValueError, match="'rollouts_generated' is a run-wide counter"):
        c.add("rollouts_generated", 1)
    assert not ledger(c, [])["balanced"]  # not registered: 5 generated rollouts unaccounted
    run = dict(policy_version=0, num_eval_prompts=0, run_dir="x", num_parameters=1)
    s = summarize(load_config("grpo"), c, [], model_path="m", **run)
    assert s["rollouts_echoed"] == 5  # not registered: still reported, by its name
    METHODS.add("echo", spec)
    try:
        led = ledger(c, [])
        assert led["echoed"] == 5 and led["balanced"] and led["filtered_no_signal"] == 0
        roles = {"roles": {}, "mu": None, "workers": 1, "trainers": 1, "gamma": None}
        assert "+ echoed away 5 (balanced)" in format_accounting(led, roles)
        s = summarize(load_config("grpo"), c, [], model_path="m", **run)
        assert s["rollouts_echoed"] == 5 and s["accounting"]["ledger"]["echoed"] == 5
        assert s["rollouts_reused"] == 2 and s["generation_rounds_extra"] == 0
        steps = SourceCounter("steps", "a name summary.json has for its own")
        METHODS.add("clash", MethodSpec(lambda ctx: None, metrics=(steps,)))
        with pytest.raises(ValueError, match=r"summary.json's own keys: \['steps'\]"):
            summarize(load_config("grpo"), c, [], model_path="m", **run)
    finally:
        METHODS.remove("echo")
        if "clash" in METHODS:
            METHODS.remove("clash")


# Counters as a checkpoint of the code before the sources owned their counters saved them
# (`Counters.__dict__`): each built-in source's counter a field, a plugin's in `extra`
OLD_STATE: dict[str, Any] = {
    "step": 6,
    "rollouts_generated": 96,
    "tokens_generated": 380,
    "tokens_trained": 700,
    "rollouts_dropped_reward_error": 0,
    "prompts_skipped_too_long": 0,
    "generation_seconds": 1.5,
    "training_seconds": 2.5,
    "wall_seconds": 4.5,
    "eval_seconds": 0.0,
    "reward_seconds": 0.1,
    "rollouts_dropped_reward_timeout": 0,
    "mu_per_step": [1.0, 2.0],
    "design": None,
    "reincarnation_step": 3,
    "evals": [],
    "first_reward_error": None,
    "rollouts_trained": 80,
    "rollouts_sampled": 0,
    "rollouts_lost_worker_died": 0,
    "rollouts_discarded": 4,
    "retired_buffer_stats": [],
    "rollouts_filtered_no_signal": 8,
    "rollouts_filtered_surplus": 0,
    "rollouts_discarded_probe": 0,
    "rollouts_reused": 12,
    "generation_rounds": 3,
    "short_steps": 1,
    "roles": {},
    "extra": {"rollouts_echoed": 2},
}


def test_a_checkpoint_with_the_old_counter_fields_loads_into_the_sources_counts() -> None:
    from replayrl.run.state import ledger, summarize

    c = Counters.from_state(OLD_STATE, declared=None)
    assert c.step == 6 and c.rollouts_generated == 96 and c.reincarnation_step == 3
    assert c.source_counts == {  # zeros are no count: the old fields were saved for any source
        "rollouts_discarded": 4,
        "rollouts_filtered_no_signal": 8,
        "rollouts_reused": 12,
        "generation_rounds": 3,
        "short_steps": 1,
        "rollouts_echoed": 2,
    }
    run = dict(policy_version=6, num_eval_prompts=0, run_dir="x", num_parameters=1)
    s = summarize(load_config("grpo"), c, [], model_path="m", **run)
    assert (s["rollouts_reused"], s["generation_rounds_extra"], s["short_steps"]) == (12, 3, 1)
    led = ledger(c, [])
    assert (led["discarded_at_reincarnation"], led["filtered_no_signal"]) == (4, 8)
    assert led["filtered_surplus"] == 0
    # saved again (the new layout) and loaded: the same counters
    again = Counters.from_state(c.state_dict(), declared=frozenset({"rollouts_reused"}))
    assert again == c and again.declared == {"rollouts_reused"}
    with pytest.raises(ValueError, match="'rollouts_reused' is 'twelve', not a count"):
        Counters.from_state({**OLD_STATE, "rollouts_reused": "twelve"}, declared=None)


def test_a_source_counting_what_it_does_not_declare_is_refused() -> None:
    c = Counters(declared=frozenset({"rollouts_reused"}))
    c.add("rollouts_reused", 3)
    with pytest.raises(ValueError, match=r"counts 'short_steps', which its .* not declare"):
        c.add("short_steps", 1)
    assert c.source_counts == {"rollouts_reused": 3}
    with pytest.raises(ValueError, match="names of run-wide counters"):
        Counters(declared=frozenset({"step"}))


def test_presets_lists_each_source_with_its_summary_and_counters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from replayrl.cli.main import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out.splitlines()
    out = out[[i for i, x in enumerate(out) if x.startswith("methods (method.name")][0] :]
    for name in METHODS:
        spec = METHODS.get(name)
        line = [x for x in out if x.startswith(f"{name} ")]
        assert len(line) == 1 and spec.summary in line[0], name
        assert all(m.name in line[0] for m in spec.metrics), name


def test_the_method_checks_run_from_the_registry() -> None:
    # each check lives with its source and still refuses what it refused in the schema
    with pytest.raises(ConfigError, match="method.name=ar3po needs runtime=sync"):
        load_config("ar3po", ["runtime=async-local"])
    with pytest.raises(ConfigError, match=r"method.ar3po.reuse=2 is more than the 1 correct"):
        load_config("ar3po", ["method.ar3po.reuse=2"])
    with pytest.raises(ConfigError, match="group replay trains on the step's"):
        load_config("group-replay", ["train.batch_size=7"])
    with pytest.raises(ConfigError, match="algorithm.loss_type=exgrpo needs method.name=exgrpo"):
        load_config(None, ["algorithm.loss_type=exgrpo"])
    with pytest.warns(UserWarning, match="is built for algorithm.loss_type=exgrpo"):
        load_config("exgrpo", ["algorithm.loss_type=grpo_clip"])


class _EchoConfig(Section):
    passes: int = Field(3, ge=1, description="passes over each batch")


def test_a_plugin_source_is_one_registration_away() -> None:
    """A source registered from outside the package is selectable, validated and built,
    without any edit to the schema or the run."""
    seen: list[str] = []

    def check(cfg) -> None:
        seen.append(cfg.method.name)

    def build(ctx) -> BufferSource:
        return BufferSource(ctx.buffer, ctx.cfg.batch_size, ctx.section("echo").passes)

    METHODS.add("echo", MethodSpec(build, _EchoConfig, check, summary="test"))
    try:
        cfg = load_config("grpo", ["method.name=echo", "method.echo.passes=5"])
        assert seen == ["echo"] and cfg.method.echo.passes == 5
        source = build_batch_source(cfg, OnPolicyQueue())
        assert isinstance(source, BufferSource) and source.epochs == 5
        with pytest.raises(ConfigError, match=r"method\.echo\.passes"):
            load_config("grpo", ["method.name=echo", "method.echo.passes=0"])
        assert cfg.model_dump()["method"]["echo"] == {"passes": 5}  # recorded in config.yaml
    finally:
        METHODS.remove("echo")
    with pytest.raises(ConfigError, match="unknown method 'echo'"):
        load_config("grpo", ["method.name=echo"])


def test_remix_is_a_buffer_source_with_its_window() -> None:
    assert type(build_batch_source(load_config("grpo"), OnPolicyQueue())) is BufferSource
    remix = build_batch_source(load_config("remix-grpo"), OnPolicyQueue())
    assert isinstance(remix, RemixSource) and remix.window is not None


def test_a_plugin_task_is_built_by_name() -> None:
    from replayrl.rollout.tasks import ArithmeticConfig, ArithmeticTask, make_task, task_from_config

    made: list[int] = []

    def build(t) -> ArithmeticTask:
        made.append(t.settings.digits)
        return ArithmeticTask(digits=1, eval_size=10, seed=t.seed)

    TASKS.add("one_digit", TaskSpec(build, ArithmeticTask, summary="test", config=ArithmeticConfig))
    try:
        cfg = load_config(None, ["task.name=one_digit", "task.one_digit.digits=2"])
        assert isinstance(task_from_config(cfg.task), ArithmeticTask) and made == [2]
        assert isinstance(make_task("one_digit", digits=1, eval_size=10), ArithmeticTask)
    finally:
        TASKS.remove("one_digit")


def _rollouts(n: int, version: int) -> list:
    import torch

    from replayrl.data.rollout_record import Rollout

    return [
        Rollout(
            torch.tensor([1]), torch.tensor([2]), torch.zeros(1), 0.0, 0.0, False, i, version, 0
        )
        for i in range(n)
    ]


def test_remix_window_is_sized_bounded_and_seeded_from_the_config() -> None:
    """The window holds N_pol policies' rollouts, drops older ones by version (not only by
    capacity) and draws from train.seed + 2 (its own stream)."""
    from replayrl.data.buffer import make_buffer
    from replayrl.methods.remix import remix_window

    cfg = load_config("remix-grpo", ["train.seed=7", "method.remix.num_policies=3"])
    window = remix_window(cfg)
    assert window.capacity == 3 * cfg.rollouts_per_step
    reference = make_buffer("replay", window.capacity, max_staleness=3, seed=9)
    for buf in (window, reference):
        buf.push(_rollouts(10, version=0))
        buf.push(_rollouts(10, version=2))
    drawn = [[r.group_id for r in buf.sample(6, current_version=2)] for buf in (window, reference)]
    assert drawn[0] == drawn[1]
    # at version 4 the version-0 rollouts are 4 > N_pol = 3 policies old: dropped
    kept = {r.policy_version for r in window.sample(10, current_version=4)}
    assert kept == {2}


def test_a_buffer_source_samples_the_size_it_is_asked_for() -> None:
    source = BufferSource(OnPolicyQueue(), batch_size=8, epochs=2)
    source.push(_rollouts(12, version=0))
    batch, passes = source.sample(0, n=3)
    assert len(batch) == 3 and passes == 2
    assert len(source.sample(0)[0]) == 8


# settings under which each built-in source counts something within two tiny steps
COUNTING: dict[str, tuple[str, list[str]]] = {
    "onpolicy": ("grpo", []),
    "replay": ("replay", []),
    "remix": ("remix-grpo", ["method.remix.reincarnation_step=1"]),  # the window dropped at step 1
    "dynamic_sampling": (  # some groups vary (trained), some do not (filtered)
        "dapo",
        [
            "method.dynamic_sampling.max_rounds=2",
            "rollout.num_generations=2",
            "rollout.temperature=0.3",
            "rewards=[{name: digits_format}]",
        ],
    ),
    "group_replay": (  # some groups vary (stored), some do not (replaced)
        "group-replay",
        ["rollout.num_generations=2", "train.steps=3", "rewards=[{name: digits_format}]"],
    ),
    "ar3po": ("ar3po", []),
    "exgrpo": ("exgrpo", ["method.exgrpo.start_accuracy=0.0"]),
    "repo": ("repo", ["method.repo.prompt_pool=2", "method.repo.min_buffer=2"]),
    "signal_replay": (  # some groups vary (trained, stored, replayed), some do not (filtered)
        "signal-replay-grpo",
        [
            "method.signal_replay.target=1.0",
            "rollout.num_generations=2",
            "train.steps=3",
            "rewards=[{name: digits_format}]",
        ],
    ),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_run_reports_every_counter_its_source_declares(name: str, tmp_path: Path) -> None:
    """summary.json (as written) holds each declared counter under its key, or its ledger
    term, with the count the run's checkpoint holds; the source counted something."""
    import json
    import warnings

    from replayrl.run.start import train
    from replayrl.storage.checkpoint import latest_checkpoint, load_state
    from tiny import tiny_config

    warnings.simplefilter("ignore", UserWarning)
    preset, extra = COUNTING.get(name, ("grpo", [f"method.name={name}"]))
    cfg = tiny_config(tmp_path, "train.steps=2", "logging.name=run", *extra, config=preset)
    assert cfg.method.name == name
    train(cfg, log=lambda _: None)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None
    counts = load_state(ckpt)["counters"]["source_counts"]
    declared = METHODS.get(name).metrics
    for m in declared:
        if m.reported_as is not None:
            assert summary[m.reported_as] == counts.get(m.name, 0), m.name
        if m.ledger is not None:
            assert summary["accounting"]["ledger"][m.ledger[0]] == counts.get(m.name, 0), m.name
    assert summary["accounting"]["ledger"]["balanced"]
    assert any(counts.get(m.name) for m in declared) or not declared, counts


def test_a_run_whose_source_counts_an_undeclared_name_fails_naming_it(tmp_path: Path) -> None:
    from replayrl.run.start import train
    from tiny import tiny_config

    class Sloppy(BufferSource):
        def before_step(self, learner: Any, counters: Any, log: Any) -> None:
            counters.add("rollouts_echoed", 1)  # declared
            if counters.step == 1:
                counters.add("rollouts_echoes", 1)  # a typo: not declared

    echoed = SourceCounter("rollouts_echoed", "echoed")
    build = lambda ctx: Sloppy(ctx.buffer, ctx.cfg.batch_size, 1)  # noqa: E731
    METHODS.add("sloppy", MethodSpec(build, metrics=(echoed,), summary="test"))
    try:
        cfg = tiny_config(tmp_path, "train.steps=2", "method.name=sloppy")
        with pytest.raises(ValueError, match="counts 'rollouts_echoes', which its"):
            train(cfg, log=lambda _: None)
    finally:
        METHODS.remove("sloppy")


class _EngineConfig(Section):
    slots: int = Field(4, ge=1, description="engine slots")


class _OtherEngineConfig(Section):
    slots: int = 1


def test_a_backend_and_a_runtime_own_their_top_level_sections() -> None:
    """The vLLM backends declare `vllm` and the Ray runtime `ray`: the schema names neither,
    every config holds both at their defaults, and the config reference lists their keys."""
    from replayrl.api.config import config_keys
    from replayrl.config.registries import BACKENDS, RUNTIMES, owned_sections
    from replayrl.config.schema import Config
    from replayrl.rollout.generation.vllm_settings import VLLMConfig, vllm_settings
    from replayrl.run.distributed.ray_settings import RayConfig, ray_settings

    assert BACKENDS.get("vllm").section == ("vllm", VLLMConfig)
    assert BACKENDS.get("vllm_server").section == ("vllm", VLLMConfig)
    assert RUNTIMES.get("ray").section == ("ray", RayConfig)
    assert owned_sections() == {"vllm": VLLMConfig, "ray": RayConfig}
    assert not set(Config.model_fields) & {"vllm", "ray"}  # nothing central names them
    cfg = load_config("grpo", ["vllm.server.port=9001", "ray.learner_num_cpus=2"])
    assert vllm_settings(cfg).server.port == 9001 and ray_settings(cfg).learner_num_cpus == 2
    assert vllm_settings(load_config("grpo")) == VLLMConfig()  # defaults where not given
    dumped = cfg.model_dump(mode="json")
    assert dumped["vllm"]["server"]["port"] == 9001 and dumped["ray"]["learner_num_cpus"] == 2
    assert Config.model_validate(dumped) == cfg  # config.yaml reads back as the same config
    assert {"vllm.server.port", "ray.weight_sync"} <= set(config_keys())
    with pytest.raises(ConfigError, match=r"vllm\.server\.prot: Extra inputs"):
        load_config("grpo", ["vllm.server.prot=1"])
    with pytest.raises(ConfigError, match=r"ray\.learner_num_cpus: Input should be"):
        load_config("grpo", ["ray.learner_num_cpus=-1"])
    with pytest.raises(ConfigError, match=r"rayy: Extra inputs are not permitted"):
        load_config("grpo", ["rayy.address=auto"])


def test_a_plugin_backend_brings_its_section_with_one_registration() -> None:
    """A backend registered from outside the package declares a section: it is validated,
    defaulted and read back with no edit to the schema; one name with two models is refused."""
    from replayrl.api.config import config_keys
    from replayrl.config.registries import BACKENDS, BackendSpec, owned_sections

    BACKENDS.add("engine", BackendSpec(lambda *a, **k: None, section=("engine", _EngineConfig)))
    try:
        cfg = load_config("grpo", ["rollout.backend=engine", "engine.slots=8"])
        assert cfg.section("engine", _EngineConfig).slots == 8
        assert load_config("grpo").section("engine", _EngineConfig).slots == 4
        assert "engine.slots" in config_keys()
        with pytest.raises(ConfigError, match=r"engine\.slots"):
            load_config("grpo", ["engine.slots=0"])
        with pytest.raises(KeyError, match="no section 'engine' of type _OtherEngineConfig"):
            cfg.section("engine", _OtherEngineConfig)
        clash = BackendSpec(lambda *a, **k: None, section=("engine", _OtherEngineConfig))
        BACKENDS.add("engine2", clash)
        try:
            with pytest.raises(TypeError, match="one section, one model"):
                owned_sections()
        finally:
            BACKENDS.remove("engine2")
        BACKENDS.add("taker", BackendSpec(lambda *a, **k: None, section=("train", _EngineConfig)))
        try:
            with pytest.raises(TypeError, match="'train', which the schema already has"):
                load_config("grpo")
        finally:
            BACKENDS.remove("taker")
    finally:
        BACKENDS.remove("engine")
    with pytest.raises(ConfigError, match="engine: Extra inputs are not permitted"):
        load_config("grpo", ["engine.slots=8"])
