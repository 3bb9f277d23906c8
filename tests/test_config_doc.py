"""docs/configuration.md is generated from the schema and committed up to date."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_doc", ROOT / "scripts" / "gen_config_doc.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_configuration_page_matches_the_schema() -> None:
    gen = _generator()
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen.render(), "run: python scripts/gen_config_doc.py"


def test_every_key_has_a_row_and_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    from replayrl.api.config_doc import key_docs

    gen = _generator()
    text = gen.render()
    for key in key_docs():
        assert f"| `{key}` |" in text, key
    stale = tmp_path / "configuration.md"
    stale.write_text(text.replace("| `train.lr` |", "| `train.learning_rate` |"))
    assert gen.main(["--check", "--out", str(stale)]) == 1
    stale.write_text(text)
    assert gen.main(["--check", "--out", str(stale)]) == 0
