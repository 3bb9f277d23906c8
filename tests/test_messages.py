"""Messages that fit the case: every key documented, nearest names for typos, whole
descriptions, values shown as a config file writes them."""

from __future__ import annotations

import pytest

from replayrl.api.config_doc import explain, key_docs, show_doc
from replayrl.bench.suite import load_suite
from replayrl.cli.main import main
from replayrl.config.catalog import PRESETS, SUITES, listing
from replayrl.config.schema import Config, ConfigError, load_config


def test_every_config_key_has_a_description():
    missing = [k for k, doc in key_docs().items() if not doc.strip()]
    assert missing == [], f"config keys without a description: {missing}"


def test_config_show_doc_writes_values_as_yaml_does_not_python_reprs():
    text = show_doc(Config())
    assert "model.path = null" in text and "logging.tensorboard = true" in text
    assert '"correctness"' in text and "None" not in text.split("#")[0]
    assert all(" = None" not in line and " = True" not in line for line in text.splitlines())
    assert "default 0.5; here 0.5" in explain(Config(), "critic.value_clip")


def test_a_preset_typo_suggests_the_nearest_name():
    with pytest.raises(ConfigError, match=r"did you mean replay\b"):  # the nearest first
        load_config("replya")


def test_a_suite_typo_suggests_the_nearest_name():
    with pytest.raises(ConfigError, match="did you mean default\\?"):
        load_suite("defualt")


@pytest.mark.parametrize("kind", [PRESETS, SUITES])
def test_listed_descriptions_are_whole_sentences(kind: str):
    for name, desc in listing(kind):
        assert desc.endswith("."), f"{name}: description cut short: {desc!r}"


def test_presets_prints_each_description_on_one_line(capsys: pytest.CaptureFixture[str]):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tuning = [line for line in lines if line.startswith("tuning ")]
    assert len(tuning) == 1 and tuning[0].endswith("picks each method's setting.")
