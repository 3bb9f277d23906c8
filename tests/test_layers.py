"""Import direction by package: arrows point down the data flow, never up or around.

    api, cli, bench                      users' entry points and benchmark tooling
      -> run.start, run.runtimes         start or resume a run: picks the runtime
        -> run.distributed               runtimes whose generators run elsewhere (processes, Ray)
          -> run.loops                   the loops (sync, async learner, the `auto` warm-up)
            -> run, run.records          one run's session and state; its folder and ledger
              -> methods                 reuse methods: each step's batch, over the parts below
                -> rollout, data, learner  produce rollouts, keep them, learn from them
                  -> algorithms, design, models, config   pure math, model loading, schema
                    -> storage, errors, registry   files that outlive a process; shared
                                                   exceptions; the plug-in registry class

A module may import its own layer or any layer below, never one above. No cycles, between
modules or between packages (two packages of one layer may not import each other), no private
imports. Read from the source with `ast`, function-level (lazy) imports included: a lazy import
is still an arrow. docs/concepts.md's "How it is built" section draws the same picture."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "replayrl"

# top to bottom; every subpackage (and top-level module) of replayrl sits in exactly one layer.
# A run's life is one wing, `run/`, layered inside too: a dotted name is a part of the wing
# with its own layer; the wing's other modules (the session and its parts) are in `run`'s.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("api", "cli", "bench"),
    ("run.start", "run.runtimes"),
    ("run.distributed",),
    ("run.loops",),
    ("run", "run.records"),
    ("methods",),
    ("rollout", "data", "learner"),
    ("algorithms", "design", "models", "config"),
    ("storage", "errors", "registry"),
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PKG.rglob("*.py")}


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def imports_of(source: str) -> list[tuple[str, str]]:
    """(module, imported name) for every replayrl import anywhere in `source`; `from replayrl
    import logprobs` counts as an import of the module replayrl.learner.logprobs."""
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
    src = "def f():\n    from replayrl.rollout.tasks import task_from_config\n"
    assert imports_of(src) == [("replayrl.rollout.tasks", "task_from_config")]
    assert imports_of("from replayrl.models import precision") == [
        ("replayrl.models.precision", "")
    ]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert {"replayrl.models.loading", "replayrl.learner.learner", "replayrl.cli.main"} <= set(
        MODULES
    )


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


PARTS = {p for layer in LAYERS for p in layer}


def package_of(module: str) -> str:
    """replayrl.run.session -> run, replayrl.run.loops.sync -> run.loops (a part of the run
    wing with its own layer); the package's own __init__ and __main__ -> replayrl."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] == "__main__":
        return parts[0]
    part = ".".join(parts[1:3])
    return part if part in PARTS else parts[1]


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which package imports which: a module's arrows, each end replaced by its package."""
    out: dict[str, set[str]] = {}
    for module, imported in g.items():
        here = package_of(module)
        out.setdefault(here, set()).update(p for p in map(package_of, imported) if p != here)
    return out


def test_the_package_check_sees_a_cycle_no_module_is_in() -> None:
    # run.entry -> run.loops.sync -> run.session: no module cycle, but the wing's `run` part
    # and its loops import each other (an entry beside the session, below the loops)
    g = {
        "replayrl.run.entry": {"replayrl.run.loops.sync"},
        "replayrl.run.loops.sync": {"replayrl.run.session"},
        "replayrl.run.session": set(),
    }
    assert cycles(g) == []
    assert cycles(package_graph(g)) == [["run", "run.loops"]]


def test_no_import_cycles_between_packages() -> None:
    g = graph()
    found = cycles(package_graph(g))
    ties = [
        f"{m} -> {d}"
        for comp in found
        for m in sorted(g)
        for d in sorted(g[m])
        if package_of(m) in comp and package_of(d) in comp and package_of(m) != package_of(d)
    ]
    assert found == [], "packages that import each other:\n" + "\n".join(ties)


def _layer(module: str) -> int:
    part = package_of(module) if module.count(".") else ""
    for depth, packages in enumerate(LAYERS):
        if part in packages:
            return depth
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_every_package_has_a_layer() -> None:
    # the top-level files are the package's own entry (__init__, __main__) and nothing else
    loose = {
        m for m in MODULES if m.count(".") == 1 and m.split(".")[1] not in PARTS | {"__main__"}
    }
    assert loose == set()
    for module in MODULES:
        if module not in ("replayrl", "replayrl.__main__"):
            _layer(module)


def test_the_layer_check_sees_an_upward_import() -> None:
    assert _layer("replayrl.learner.learner") > _layer("replayrl.run.session")
    assert _layer("replayrl.storage.io") > _layer("replayrl.models.loading")
    assert upward_imports("replayrl.learner.x", "from replayrl.run.session import S") == {
        "replayrl.run.session"
    }
    assert upward_imports("replayrl.run.x", "from replayrl.learner.learner import L") == set()
    # inside the run wing: the session may not reach up to the loops that drive it
    assert upward_imports("replayrl.run.session", "from replayrl.run.loops import sync") == {
        "replayrl.run.loops.sync"
    }
    assert upward_imports("replayrl.run.loops.sync", "from replayrl.run import session") == set()


def upward_imports(module: str, source: str) -> set[str]:
    depth = _layer(module)
    return {m for m, _ in imports_of(source) if m != "replayrl" and _layer(m) < depth}


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if m not in ("replayrl", "replayrl.__main__"))
)
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    upward = upward_imports(module, MODULES[module].read_text())
    assert not upward, f"{module} imports {upward} (upward)"


def test_models_loading_imports_only_the_config() -> None:
    """models/loading.py is at the bottom: the warm start (which needs a task) is run/warmstart's,
    the merged export reads checkpoints through storage."""
    imported = {mod for mod, _ in imports_of(MODULES["replayrl.models.loading"].read_text())}
    assert imported <= {"replayrl.config.schema"}


def test_storage_imports_nothing_above_it() -> None:
    for name, path in MODULES.items():
        if name.startswith("replayrl.storage"):
            imported = {m for m, _ in imports_of(path.read_text())}
            assert {m for m in imported if not m.startswith("replayrl.storage")} == set()


def test_the_registry_class_imports_nothing_of_replayrl() -> None:
    assert not imports_of(MODULES["replayrl.registry"].read_text())


@pytest.mark.parametrize("package", ["algorithms", "design"])
def test_the_pure_packages_import_only_themselves(package: str) -> None:
    """Losses, advantages and the buffer-design math are functions of numbers and tensors
    (and the plug-in registry class, which imports nothing of replayrl)."""
    prefix = f"replayrl.{package}"
    for name, path in MODULES.items():
        if _under(name, (prefix,)):
            imported = {m for m, _ in imports_of(path.read_text())}
            outside = {m for m in imported if not _under(m, (prefix, "replayrl.registry"))}
            assert not outside, f"{name} imports {outside}"


def test_no_private_imports_between_modules() -> None:
    private = [
        f"{name}: from {mod} import {attr}"
        for name, path in MODULES.items()
        for mod, attr in imports_of(path.read_text())
        if attr.startswith("_")
    ]
    assert private == []
