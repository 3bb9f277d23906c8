"""No function in src is over 80 lines (a long function hides its steps; split it).

Read with `ast`: a function's lines run from its `def` (decorators excluded) to its last
statement, docstring and comments included. None is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "replayrl"
MAX_LINES = 80
EXEMPT: dict[str, str] = {}  # "path.py:function" -> why it cannot be split


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                out.append((node.name, n))
    return out


def test_the_checker_counts_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert long_functions(f"def f():\n{body}\n") == [("f", 81)]
    assert long_functions(f"def f():\n{body}\n", limit=81) == []


def test_no_function_in_src_is_over_80_lines() -> None:
    found = [
        f"{path.relative_to(SRC)}:{name} ({n} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for name, n in long_functions(path.read_text())
        if f"{path.relative_to(SRC)}:{name}" not in EXEMPT
    ]
    assert found == []
