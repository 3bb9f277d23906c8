"""The one registry class: lazy providers, nearest-name errors, and installed plugins found
through the `replayrl.plugins` entry-point group."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from replayrl import registry as registry_module
from replayrl.config.registries import TASKS
from replayrl.config.schema import ConfigError, load_config
from replayrl.registry import PLUGIN_GROUP, Registry, load_plugins, reset_plugins


def test_an_unknown_name_lists_the_registered_ones_and_the_nearest() -> None:
    reg: Registry[int] = Registry("widget", "section.widget")
    reg.add("positive_bias", 1)
    reg.add("uniform", 2)
    with pytest.raises(
        ValueError,
        match=r"unknown widget 'unifrom' \(known: positive_bias, "
        r"uniform\); did you mean uniform\?",
    ):
        reg.get("unifrom")
    with pytest.raises(ValueError) as info:
        reg.get("zzz")
    assert "did you mean" not in str(info.value)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", 3)


def test_providers_are_imported_on_first_use(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "widget_provider.py").write_text(
        "from tests_widget_registry import WIDGETS\nWIDGETS.add('w', 7)\n"
    )
    (tmp_path / "tests_widget_registry.py").write_text(
        "from replayrl.registry import Registry\n"
        "WIDGETS = Registry('widget', 'x.widget', ('widget_provider',))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tests_widget_registry

    try:
        assert "widget_provider" not in sys.modules  # nothing imported before it is asked
        assert tests_widget_registry.WIDGETS.get("w") == 7
        assert "widget_provider" in sys.modules
    finally:
        sys.modules.pop("widget_provider", None)
        sys.modules.pop("tests_widget_registry", None)


def _install_plugin(root: Path, module: str, body: str, value: str) -> None:
    """A distribution installed under `root` with one `replayrl.plugins` entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{module}_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{module} = {value}\n")


@pytest.fixture
def plugin_root(tmp_path: Path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_plugins()
    yield tmp_path
    reset_plugins()


def test_an_installed_package_adds_a_task_through_its_entry_point(plugin_root: Path) -> None:
    _install_plugin(
        plugin_root,
        "fake_replayrl_tasks",
        """
        from replayrl.config.registries import TASKS, TaskSpec
        from replayrl.rollout.tasks import ArithmeticTask

        def register():
            TASKS.add("plugged_arithmetic", TaskSpec(
                lambda t: ArithmeticTask(digits=1, eval_size=5, seed=0), ArithmeticTask,
                summary="from an installed package"))
        """,
        "fake_replayrl_tasks:register",
    )
    try:
        cfg = load_config(None, ["task.name=plugged_arithmetic"])  # the config finds it
        assert cfg.task.name == "plugged_arithmetic"
        assert TASKS.get("plugged_arithmetic").summary == "from an installed package"
        load_plugins()  # once per process: a second load adds nothing twice
    finally:
        TASKS.remove("plugged_arithmetic")
        sys.modules.pop("fake_replayrl_tasks", None)


def test_a_broken_plugin_is_an_error_naming_it(plugin_root: Path) -> None:
    _install_plugin(
        plugin_root,
        "broken_replayrl_plugin",
        "raise RuntimeError('boom')\n",
        "broken_replayrl_plugin",
    )
    try:
        with pytest.raises(ImportError, match=r"plugin 'broken_replayrl_plugin'.*boom"):
            TASKS.get("arithmetic")
    finally:
        (plugin_root / "broken_replayrl_plugin_dist-0.1.dist-info" / "entry_points.txt").unlink()
        sys.modules.pop("broken_replayrl_plugin", None)
        reset_plugins()
    assert TASKS.get("arithmetic") is not None


def test_without_plugins_the_config_still_loads(monkeypatch) -> None:
    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points", lambda **_: [])
    reset_plugins()
    try:
        with pytest.raises(
            ConfigError, match=r"unknown task 'arithmatic'.*did you mean arithmetic"
        ):
            load_config(None, ["task.name=arithmatic"])
    finally:
        reset_plugins()
