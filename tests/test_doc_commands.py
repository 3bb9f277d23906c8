"""Every `replayrl` command in README.md and docs/ parses with the CLI's own parser, and
every config it names resolves: the preset (or file) and each `key=value` override are
checked the way `replayrl config show` checks them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from replayrl.cli.main import build_parser, legacy_bench_form
from replayrl.config.schema import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# placeholders a reader replaces: a command naming one is parsed, its files are not opened
PLACEHOLDERS = ("NAME", "path/to", "my.yaml", "my_rewards.py", "PRESET", "KEY", "RUN", "runs/")


def shell_blocks(text: str) -> list[str]:
    """The fenced blocks of a Markdown page marked bash, sh or console, or unmarked."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if lang is None:
                lang, lines = line.strip()[3:].strip() or "-", []
            else:
                if lang in ("bash", "sh", "console", "-"):
                    blocks.append("\n".join(lines) + "\n")
                lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) for each `replayrl ...` line of a fenced shell block."""
    found = []
    for page in PAGES:
        for block in shell_blocks(page.read_text()):
            text = re.sub(r"\\\n\s*", " ", block)  # continuation lines
            for line in text.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("replayrl "):
                    found.append((str(page.relative_to(ROOT)), line))
    return found


COMMANDS = doc_commands()


def test_the_docs_have_commands_to_check() -> None:
    assert len(COMMANDS) > 20
    assert any("eval --model runs/NAME/final" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[c[:60] for _, c in COMMANDS])
def test_doc_command_parses_and_its_config_resolves(page: str, command: str) -> None:
    argv = shlex.split(command, comments=True)[1:]
    try:
        args = build_parser().parse_args(legacy_bench_form(argv))
    except SystemExit as exc:
        pytest.fail(f"{page}: `{command}` does not parse (exit {exc.code})")
    if getattr(args, "func", None) is None or not hasattr(args, "overrides"):
        return
    if getattr(args, "resume", None) or getattr(args, "run", None):
        return  # the run folder's own config
    config = getattr(args, "config", None)
    if config is not None and any(p in config for p in PLACEHOLDERS):
        return
    overrides = [o for o in args.overrides if not any(p in o for p in PLACEHOLDERS)]
    try:
        load_config(config, overrides)
    except ConfigError as exc:
        pytest.fail(f"{page}: `{command}`: {exc}")
