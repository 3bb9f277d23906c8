"""The project speaks to its users: no talk of how it was made in what they read.

Markdown files, committed results text under benchmarks/results/, and the comments and
docstrings of the code and configs must not refer to numbered work periods ("the sixth
session", "the seventh's"), issue numbers ("issue #24", "issue 21"), the people who built it
("lead", "helpers", "coordinator"), notes that are not in the repository ("papers.md") or
absolute scratch paths ("/tmp/...", "/work/..."). Code identifiers such as `run/session.py`
or a `Session` class are not matched: the patterns are phrases, not words.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
)
_NUMBER = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+)"

# (name, pattern) for every file read by users; matched case-insensitively.
PROSE_PATTERNS: list[tuple[str, str]] = [
    ("numbered work period", rf"\b{_ORDINAL}\s+sessions?\b"),
    ("numbered work period", rf"\bsessions?\s+(?:{_NUMBER})\b(?:\s+(?:to|and|-)\s+{_NUMBER})?"),
    ("numbered work period", rf"\bthe\s+{_ORDINAL}['’]s\b"),
    ("issue number", r"\bissues?\s*#?\s*\d+"),
    ("people who built it", r"\b(?:the\s+lead|lead['’]s|helpers?|coordinator)\b"),
    ("notes outside the repository", r"\b(?:papers|design|gpu-notes|speed-notes)\.md\b"),
    ("notes outside the repository", r"\bCOMMON\.md\b"),
    ("absolute scratch path", r"(?<![\w.])/(?:tmp|work|home/\w+|root)/"),
]

# In Python, TOML and YAML the word "helper" is ordinary programming vocabulary and /tmp/
# appears in test fixtures; the rest applies unchanged.
CODE_EXEMPT = {"people who built it", "absolute scratch path"}
CODE_PATTERNS: list[tuple[str, str]] = [
    *[(n, p) for n, p in PROSE_PATTERNS if n not in CODE_EXEMPT],
    ("people who built it", r"\b(?:the\s+lead|lead['’]s|coordinator)\b"),
    ("absolute scratch path", r"(?<![\w.])/work/"),
]

RESULT_SUFFIXES = {".md", ".txt", ".json", ".csv", ".yaml", ".yml", ".log"}
SKIP_DIRS = {".git", ".venv", "venv", "site", "runs", "mutants", "node_modules", "build"}
SELF = Path(__file__).resolve()


def violations(text: str, patterns: list[tuple[str, str]]) -> list[tuple[int, str, str]]:
    """(line number, what, matched text) for every match of `patterns` in `text`; a phrase
    broken across lines ("the sixth\n  session") is found too."""
    found: list[tuple[int, str, str]] = []
    for name, pattern in patterns:
        for m in re.finditer(pattern, text, flags=re.IGNORECASE):
            found.append((text.count("\n", 0, m.start()) + 1, name, m.group(0)))
    return sorted(found)


def _walk(base: Path, suffixes: set[str]) -> list[Path]:
    out = []
    for path in base.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel[:-1]):
            continue
        if path.is_file() and path.suffix in suffixes and path.resolve() != SELF:
            out.append(path)
    return sorted(out)


def prose_files() -> list[Path]:
    """Markdown anywhere in the repository, and results text under benchmarks/results/."""
    files = _walk(ROOT, {".md"})
    results = ROOT / "benchmarks" / "results"
    if results.is_dir():
        files += [p for p in _walk(results, RESULT_SUFFIXES) if p.suffix != ".md"]
    return files


def code_files() -> list[Path]:
    """Code, configs and build files whose comments and docstrings users read."""
    files: list[Path] = []
    for folder in ("src", "tests", "benchmarks", "examples", "scripts"):
        if (ROOT / folder).is_dir():
            files += _walk(ROOT / folder, {".py", ".yaml", ".yml", ".toml"})
    files = [p for p in files if "results" not in p.relative_to(ROOT).parts]
    for name in ("pyproject.toml", "Makefile", "mkdocs.yml", ".ci/run"):
        if (ROOT / name).is_file():
            files.append(ROOT / name)
    return files


def _report(path: Path, found: list[tuple[int, str, str]]) -> list[str]:
    rel = path.relative_to(ROOT)
    return [f"{rel}:{lineno}: {what}: {text!r}" for lineno, what, text in found]


# -- the patterns themselves, on planted text ------------------------------------------------


@pytest.mark.parametrize(
    "planted",
    [
        "measured in the sixth session",
        "Up to the seventh's probe",
        "sessions two to six",
        "as issue #24 asks",
        "see issue 21",
        "Issue #24's targets",
        "four helpers' test runs",
        "the lead's editing",
        "papers.md §4",
        "--out /tmp/s2/ev",
        "cache in /work/main/.venv",
        "the probe up to the sixth\n           session of 2026-12-01",
    ],
)
def test_a_planted_reference_is_found(planted: str) -> None:
    assert violations(f"A line.\nSome text {planted} here.\n", PROSE_PATTERNS), planted


@pytest.mark.parametrize(
    "clean",
    [
        "run/session.py builds a run's services",
        "class Session: one run",
        "a Ray session on two nodes",  # a session without a number is a word, not a period
        "rollouts to 90% of the gain; mu = 5.3",
        "leads to a smaller buffer",
        "issued one call per prompt",
        "runs/bench/heldout/sub6/grpo-s0",
        "## Results",
        "commit 2aef153, 2026-12-01",
    ],
)
def test_ordinary_text_is_not_flagged(clean: str) -> None:
    assert violations(clean, PROSE_PATTERNS) == []


def test_code_patterns_allow_helpers_but_not_issue_numbers() -> None:
    assert violations("# pure helpers for the learner", CODE_PATTERNS) == []
    assert violations("# the wiring (issue 21)", CODE_PATTERNS)
    assert violations('"""Added in the fifth session."""', CODE_PATTERNS)


# -- the repository ---------------------------------------------------------------------------


def test_markdown_and_results_text_speak_to_users() -> None:
    files = prose_files()
    assert any(p.name == "README.md" for p in files)
    problems = [
        line
        for path in files
        for line in _report(path, violations(path.read_text(errors="replace"), PROSE_PATTERNS))
    ]
    assert problems == [], "\n".join(problems[:50]) + f"\n({len(problems)} in all)"


def test_code_comments_and_configs_speak_to_users() -> None:
    files = code_files()
    assert any(p.name == "schema.py" for p in files)
    problems = [
        line
        for path in files
        for line in _report(path, violations(path.read_text(errors="replace"), CODE_PATTERNS))
    ]
    assert problems == [], "\n".join(problems[:50]) + f"\n({len(problems)} in all)"
