"""Import direction: arrows point down the data flow (cli -> run/recipes -> learner/generation/
buffer -> algorithms/models), no cycles, no private imports. Read from the source with `ast`,
function-level (lazy) imports included: a lazy import is still an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "replayrl"

# the loop and everything above it; nothing in the lower layers may import these
UPPER = (
    "replayrl.api",
    "replayrl.cli",
    "replayrl.components",
    "replayrl.distributed",
    "replayrl.recipes",
    "replayrl.run",
    "replayrl.runner",
    "replayrl.session",
)
# modules above the model/algorithm layer that models.py once reached into (the warm start's
# task, the export's checkpoint) and the modules that now hold those jobs
ABOVE_MODELS = (
    "replayrl.tasks",
    "replayrl.checkpoint",
    "replayrl.warmstart",
    "replayrl.export",
    "replayrl.policy",
)
LOWER = (
    "replayrl.algorithms",
    "replayrl.models",
    "replayrl.learner",
    "replayrl.batching",
    "replayrl.critic",
    "replayrl.frozen",
    "replayrl.logprobs",
    "replayrl.precision",
    "replayrl.generation",
    "replayrl.buffer",
    "replayrl.batch_source",
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PKG.rglob("*.py")}


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def imports_of(source: str) -> list[tuple[str, str]]:
    """(module, imported name) for every replayrl import anywhere in `source`; `from replayrl
    import logprobs` counts as an import of the module replayrl.logprobs."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "replayrl":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub, "") if sub in MODULES else (node.module, alias.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.split(".")[0] == "replayrl"]
    return out


def graph() -> dict[str, set[str]]:
    return {m: {mod for mod, _ in imports_of(p.read_text())} for m, p in MODULES.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_checks_see_lazy_imports_and_cycles() -> None:
    # the checks below would pass vacuously if the parsing or the cycle search saw nothing
    src = "def f():\n    from replayrl.tasks import task_from_config\n"
    assert imports_of(src) == [("replayrl.tasks", "task_from_config")]
    assert imports_of("from replayrl import precision") == [("replayrl.precision", "")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert {"replayrl.models", "replayrl.learner", "replayrl.cli"} <= set(MODULES)


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_models_imports_only_the_config() -> None:
    """models.py is at the bottom: the warm start (which needs a task) is warmstart.py's, the
    merged export (which reads checkpoints) is export.py's."""
    imported = {mod for mod, _ in imports_of(MODULES["replayrl.models"].read_text())}
    assert not {m for m in imported if _under(m, ABOVE_MODELS + UPPER)}
    assert imported <= {"replayrl.config"}


def test_algorithms_import_only_algorithms() -> None:
    for name, path in MODULES.items():
        if _under(name, ("replayrl.algorithms",)):
            imported = {m for m, _ in imports_of(path.read_text())}
            outside = {m for m in imported if not _under(m, ("replayrl.algorithms",))}
            assert not outside, f"{name} imports {outside}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _under(m, LOWER)))
def test_lower_layers_never_import_the_loop(module: str) -> None:
    upward = {m for m, _ in imports_of(MODULES[module].read_text()) if _under(m, UPPER)}
    assert not upward, f"{module} imports {upward} (upward)"


def test_no_private_imports_between_modules() -> None:
    private = [
        f"{name}: from {mod} import {attr}"
        for name, path in MODULES.items()
        for mod, attr in imports_of(path.read_text())
        if attr.startswith("_")
    ]
    assert private == []
