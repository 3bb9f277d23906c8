"""Shared fixtures: an isolated warm-start cache and a tiny fp32 Llama with the char tokenizer."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import worktree_guard  # tests/worktree_guard.py
from replayrl.config.schema import ModelConfig
from replayrl.models.loading import build_char_tokenizer, build_tiny_model
from replayrl.rollout.tasks import ArithmeticTask

# The smallest model the code accepts that still has every part of a Llama block.
TINY = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory):
    """Warm starts built by the tests go to a per-session temp folder, never ~/.cache."""
    old = os.environ.get("REPLAYRL_CACHE")
    os.environ["REPLAYRL_CACHE"] = str(tmp_path_factory.mktemp("replayrl_cache"))
    yield
    if old is None:
        os.environ.pop("REPLAYRL_CACHE", None)
    else:
        os.environ["REPLAYRL_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def _isolated_trust_key(tmp_path_factory: pytest.TempPathFactory):
    """Runs started by the tests (in this process and in subprocesses, which inherit the
    environment) sign with a per-session key, never one in the real ~/.config."""
    old = os.environ.get("REPLAYRL_TRUST_KEY")
    os.environ["REPLAYRL_TRUST_KEY"] = str(tmp_path_factory.mktemp("trust") / "trust-key")
    yield
    if old is None:
        os.environ.pop("REPLAYRL_TRUST_KEY", None)
    else:
        os.environ["REPLAYRL_TRUST_KEY"] = old


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """The models here are tiny: on the shared 2-core machine, intra-op threads only contend
    (a 32-wide linear took ~15 ms with 2 threads under load vs. microseconds with 1)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer(ArithmeticTask().corpus())


@pytest.fixture(scope="session")
def tiny_model_config() -> ModelConfig:
    return ModelConfig.model_validate({"tiny": TINY})


@pytest.fixture(scope="session")
def tiny_model(char_tokenizer, tiny_model_config):
    """A randomly initialised fp32 tiny Llama in eval mode (tests must not train it)."""
    model = build_tiny_model(tiny_model_config, vocab_size=len(char_tokenizer), seed=0)
    assert model.dtype == torch.float32
    return model.eval()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `ray` are skipped, one by one, when ray is not installed; tests marked
    `gpu` when this machine has no CUDA GPU (scripts/gpu_check.sh runs them on one)."""
    if not torch.cuda.is_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh)")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(no_gpu)
    if importlib.util.find_spec("ray") is not None:
        return
    skip = pytest.mark.skip(reason="ray is not installed (the `ray` extra)")
    for item in items:
        if "ray" in item.keywords:
            item.add_marker(skip)


# -- nothing a test writes lands in the working tree ---------------------------------------
_REPO = Path(__file__).resolve().parent.parent
_TREE_BEFORE: dict[str, set[str] | None] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _TREE_BEFORE["status"] = worktree_guard.snapshot(_REPO)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    new = worktree_guard.added(_TREE_BEFORE.get("status"), worktree_guard.snapshot(_REPO))
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            "tests wrote into the working tree (write under tmp_path instead):\n  "
            + "\n  ".join(new)
        )
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
