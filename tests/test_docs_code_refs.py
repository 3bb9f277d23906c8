"""Code pointers in the docs resolve: a backticked `dir/file.py` names a file of the project,
and `dir/file.py: Name, Other.attr` names things that file defines. Files move; a page that
points to where the code was is worse than no pointer."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the history page quotes files of earlier layouts on purpose
PAGES = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "results-history.md"] + [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
]
REF = re.compile(r"`([\w-]+(?:/[\w.-]+)+\.py)(?::\s*([^`]+))?`")
BASES = [ROOT, ROOT / "src" / "replayrl", ROOT / "src"]
# not ours: a placeholder in an example, another repository's file quoted beside its name
NOT_OURS = {"path/to/file.py", "src/replay_grpo_trainer.py"}


def resolve(path: str) -> Path | None:
    return next((b / path for b in BASES if (b / path).is_file()), None)


def defines(source: str, dotted: str) -> bool:
    """Whether `source` defines the last part of `dotted` (a def, class or assignment)."""
    name = dotted.split("(")[0].strip().split(".")[-1]
    if not re.fullmatch(r"\w+", name):
        return True  # not a name: prose after the colon
    return bool(
        re.search(
            rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*(?:self\.)?{name}\s*[:=]", source, re.M
        )
    )


def broken_refs(text: str) -> list[str]:
    out = []
    for m in REF.finditer(text):
        path, names = m.group(1), m.group(2)
        if path in NOT_OURS:
            continue
        found = resolve(path)
        if found is None:
            out.append(f"{path}: no such file")
            continue
        source = found.read_text()
        for dotted in re.split(r"[,;]\s*", names or ""):
            if dotted.strip() and not defines(source, dotted):
                out.append(f"{path}: {dotted.strip()} is not defined there")
    return out


def test_a_moved_file_and_a_renamed_symbol_are_caught() -> None:
    assert broken_refs("`data/batch_source.py: RemixSource.sample`") == [
        "data/batch_source.py: no such file"
    ]
    assert broken_refs("`methods/remix.py: RemixSource.sample_all`") == [
        "methods/remix.py: RemixSource.sample_all is not defined there"
    ]
    assert broken_refs("`methods/remix.py: RemixSource.sample, stale_count`") == []


def test_code_pointers_in_the_docs_resolve() -> None:
    problems = [
        f"{page.relative_to(ROOT)}: {p}" for page in PAGES for p in broken_refs(page.read_text())
    ]
    assert not problems, "\n".join(problems)
