"""scripts/gpu_check.sh on an image like the GPU machine's: a Python with only torch,
transformers and pytest (and what they need), plus the wheels of `make gpu-bundle`, run up to
its first CUDA call (here: no CUDA, so it stops there). Building that environment is slow on
a small CPU machine and `make gpu-bundle` needs the network: set REPLAYRL_BARE_VENV_TEST=1
to run it."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ("torch", "transformers", "pytest")
# what the GPU image lacks although this environment's transformers pulls it in (via
# huggingface-hub's extras here; the image's transformers 5.17 does not)
ABSENT = {"pydantic", "pydantic-core", "annotated-types", "typing-inspection", "hypothesis"}

pytestmark = pytest.mark.skipif(
    os.environ.get("REPLAYRL_BARE_VENV_TEST") != "1", reason="set REPLAYRL_BARE_VENV_TEST=1"
)


def closure(names: tuple[str, ...]) -> set[str]:
    """The installed distributions `names` need, themselves included (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen or name in ABSENT:
            continue
        seen.add(name)
        for req in md.distribution(name).requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def bare_venv(where: Path) -> Path:
    """A venv (no system site-packages) holding links to only the closure of IMAGE."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    for name in closure(IMAGE):
        dist = md.distribution(name)
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top != ".." and (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    return py


def test_gpu_check_runs_on_a_bare_image_up_to_its_first_cuda_call(tmp_path):
    wheels = tmp_path / "wheels"  # the bundle, for this machine's Python (the image's is 3.12)
    version = f"PY={sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(
        ["make", "-s", "gpu-bundle", version, f"HOST_PY={sys.executable}", f"GPU_BUNDLE={wheels}"],
        cwd=ROOT, check=True, timeout=600,
    )  # fmt: skip
    assert list(wheels.glob("pydantic-*.whl"))
    py = bare_venv(tmp_path / "venv")
    missing = subprocess.run([py, "-c", "import pydantic"], capture_output=True)
    assert missing.returncode != 0, "the bare environment must not have pydantic"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=str(py), GPU_CHECK_WORK=str(tmp_path / "work"), GPU_WHEELS=str(wheels))
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(tmp_path / "out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "no CUDA GPU" in out, out[-3000:]
    assert "Error" not in out.split("no CUDA GPU")[0].replace("AssertionError", ""), out[-3000:]
    assert "collecting the GPU-marked tests" in out
    assert list((tmp_path / "out").iterdir()) == []  # nothing but gpu_check.json goes there
