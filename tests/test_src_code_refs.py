"""File paths named in the comments and docstrings of src/ resolve to a file of the project
(as tests/test_docs_code_refs.py checks for the docs): a comment that points to where the code
was sends the next reader looking for a file that does not exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "replayrl"
# a path (`run/loops/probe.py`) or a bare file name (`probe.py`) of a source, doc or script
REF = re.compile(r"(?<![\w/.\-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh))\b")
# not ours: placeholders for a user's reward file, another repository's files quoted by name
NOT_OURS = {
    "path/to/file.py",
    "file.py",
    "f.py",
    "rewards.py",
    "replay_grpo_trainer.py",
    "vllm/v1/sample/ops/topk_topp_sampler.py",
    "vllm/v1/executor/uniproc_executor.py",
}
SKIP_DIRS = {".git", ".venv", "node_modules", "site", "__pycache__"}


def project_files() -> list[str]:
    """Every file of the checkout, as '/'-joined paths relative to its root."""
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
    ]


def comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, doc


def missing_refs(text: str, files: list[str]) -> list[str]:
    """Paths named in `text` that no project file ends with (a bare name: no file has it)."""
    names = {f.rsplit("/", 1)[-1] for f in files}
    out = []
    for m in REF.finditer(text):
        ref = m.group(1)
        if ref in NOT_OURS:
            continue
        found = (
            ref in names
            if "/" not in ref
            else any(f == ref or f.endswith("/" + ref) for f in files)
        )
        if not found:
            out.append(ref)
    return out


def test_a_moved_file_is_caught_and_a_placeholder_is_not() -> None:
    files = ["src/replayrl/run/loops/probe.py", "src/replayrl/design/theory.py", "README.md"]
    text = "see run/loops/design_probe.py and design/theory.py, probe.py, design_probe.py"
    assert missing_refs(text, files) == ["run/loops/design_probe.py", "design_probe.py"]
    assert missing_refs("(path/to/file.py:fn, `rewards.py`, README.md)", files) == []
    comment = "x = 1  # the warm-up (design/auto.py)\n"
    assert list(comments_and_docstrings('"""Doc: data/design.py."""\n' + comment)) == [
        (2, "# the warm-up (design/auto.py)"),
        (1, "Doc: data/design.py."),
    ]


def test_paths_in_src_comments_and_docstrings_resolve() -> None:
    files = project_files()
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {ref}"
        for path in sorted(SRC.rglob("*.py"))
        for line, text in comments_and_docstrings(path.read_text())
        for ref in missing_refs(text, files)
    ]
    assert not problems, "\n".join(problems)
