"""Write the snapshot of vLLM's API that the rollout backend uses, read with `ast` from a vLLM
wheel or an installed vLLM (nothing is imported: no GPU needed).

    python scripts/vllm_signatures.py .venv-vllm/lib/python3.11/site-packages \
        > tests/data/vllm_signatures.json          # the engine `make test-vllm` installs
    pip download vllm==0.33.0 --no-deps -d /tmp/wheels   # or a CUDA release's wheel
    python scripts/vllm_signatures.py /tmp/wheels/vllm-0.33.0-*.whl > ...

The snapshot holds LLM.__init__'s, LLM.generate's and LLM.collective_rpc's parameters, the
engine arguments LLM passes on through **kwargs (EngineArgs' fields), the parameters of the
model runner's reload_weights (what the weight sync calls through collective_rpc),
SamplingParams' fields and the fields of RequestOutput, CompletionOutput and Logprob.
tests/fake_vllm checks every call the backend makes against it, for what the CPU build of
vLLM cannot run (the real engine is tested by `make test-vllm`).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

# (file inside the wheel, class, what to read: a method's parameters or the class's fields)
WANTED = [
    ("vllm/entrypoints/llm.py", "LLM", "__init__"),
    ("vllm/entrypoints/llm.py", "LLM", "generate"),
    ("vllm/entrypoints/llm.py", "LLM", "collective_rpc"),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "reload_weights"),
    ("vllm/engine/arg_utils.py", "EngineArgs", None),
    ("vllm/sampling_params.py", "SamplingParams", None),
    ("vllm/outputs.py", "RequestOutput", "__init__"),
    ("vllm/outputs.py", "CompletionOutput", None),
    ("vllm/logprobs.py", "Logprob", None),
]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"class {name} not found")


def method_parameters(cls: ast.ClassDef, method: str) -> dict[str, object]:
    """Parameter names (without self), which are keyword-only, whether **kwargs is taken."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            a = node.args
            positional = [p.arg for p in a.posonlyargs + a.args][1:]
            return {
                "positional": positional,
                "keyword_only": [p.arg for p in a.kwonlyargs],
                "var_keyword": a.kwarg is not None,
            }
    raise SystemExit(f"{cls.name}.{method} not found")


def class_fields(cls: ast.ClassDef) -> list[str]:
    """Annotated class-level names (dataclass / msgspec fields), public ones only."""
    names = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if not node.target.id.startswith("_"):
                names.append(node.target.id)
    return names


def _reader(source: str) -> tuple[str, object]:
    """(vLLM's version, a function from a path inside the package tree to its text) for a
    wheel or a folder that holds `vllm/` (site-packages)."""
    if source.endswith(".whl"):
        version = re.search(r"vllm(?:_cpu)?-([^-]+)-", Path(source).name)
        zf = zipfile.ZipFile(source)
        return (version.group(1) if version else "unknown"), lambda p: zf.read(p).decode()
    root = Path(source)
    found = re.search(r"__version__ = version = '([^']+)'", (root / "vllm/_version.py").read_text())
    return (found.group(1) if found else "unknown"), lambda p: (root / p).read_text()


def snapshot(source: str) -> dict[str, object]:
    version, read = _reader(source)
    out: dict[str, object] = {"vllm_version": version}
    for path, cls_name, method in WANTED:
        cls = _class(ast.parse(read(path)), cls_name)  # type: ignore[operator]
        key = f"{cls_name}.{method}" if method else cls_name
        out[key] = method_parameters(cls, method) if method else class_fields(cls)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(snapshot(argv[0]), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
