"""`train.preflight` (bench/preflight.py): before any weights reach a GPU, the plan's learner
estimate against the learner GPU's free memory. The GPU's memory is injected (`memory=`), so
refusal, warning and pass are observed on a CPU-only machine; `replayrl train` and
`ReplayTrainer.train` refuse before a run folder is written."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from replayrl.bench import preflight as preflight_module
from replayrl.bench.memory import SHAPES
from replayrl.bench.plan import GIB
from replayrl.bench.preflight import DeviceMemory, preflight
from replayrl.config.schema import Config, load_config
from replayrl.errors import RunDoesNotFit

# Qwen2.5-1.5B, full fine-tuning, 16 rows of 256 + 2048 tokens per micro-batch without
# checkpointing: ~207 GiB by the plan, of which ~181 GiB activations
LONG_ROWS = [
    "train.micro_batch_size=16",
    "rollout.max_new_tokens=2048",
    "model.gradient_checkpointing=false",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder with Qwen2.5-1.5B's config.json (no weights: none are loaded)."""
    folder = tmp_path_factory.mktemp("qwen")
    (folder / "config.json").write_text(json.dumps(SHAPES["qwen2.5-1.5b"]))
    return folder


def _cfg(model_dir: Path, *overrides: str) -> Config:
    return load_config("grpo", [f"model.path={model_dir}", *LONG_ROWS, *overrides])


class GPU:
    """One learner GPU with `free` GiB of 80 free; counts the queries."""

    def __init__(self, free: float) -> None:
        self.free, self.calls = free, 0

    def __call__(self, cfg: Config) -> list[DeviceMemory]:
        self.calls += 1
        return [DeviceMemory("cuda:0", int(self.free * GIB), 80 * GIB)]


def test_a_run_that_does_not_fit_is_refused_naming_the_knobs_that_would(model_dir) -> None:
    with pytest.raises(RunDoesNotFit) as caught:
        preflight(_cfg(model_dir), print, memory=GPU(40))
    msg = str(caught.value)
    estimate = float(re.search(r"estimates ([\d.]+) GiB per learner GPU", msg).group(1))
    assert estimate > 40
    assert "cuda:0 has 40.0 GiB free of 80.0 GiB" in msg
    assert "256 prompt + 2048 completion tokens per row" in msg
    assert "train.preflight=warn" in msg and "train.preflight=off" in msg
    # each knob it names fits when applied: checkpointing, and fewer rows per micro-batch
    # (said also as the token budget that packs as many rows)
    assert "model.gradient_checkpointing=true" in msg
    rows = int(re.search(r"train\.micro_batch_size=(\d+)", msg).group(1))
    budget = int(re.search(r"train\.max_tokens_per_micro_batch=(\d+)", msg).group(1))
    assert 1 <= rows < 16 and budget == rows * (256 + 2048)
    for fix in (
        ["model.gradient_checkpointing=true"],
        [f"train.micro_batch_size={rows}"],
        [f"train.max_tokens_per_micro_batch={budget}"],
    ):
        need = preflight(_cfg(model_dir, *fix), print, memory=GPU(40))
        assert need is not None and need <= 40 * GIB, fix


def test_a_run_that_fits_passes_with_its_estimate(model_dir) -> None:
    logged: list[str] = []
    gpu = GPU(80)
    need = preflight(_cfg(model_dir, "model.gradient_checkpointing=true"), logged.append, gpu)
    assert gpu.calls == 1 and need is not None and 0 < need <= 80 * GIB
    assert logged == []
    # what counts is the free memory, not the GPU's size (another process holds the rest)
    with pytest.raises(RunDoesNotFit, match="has 30.0 GiB free of 80.0 GiB"):
        preflight(_cfg(model_dir, "model.gradient_checkpointing=true"), print, GPU(30))
    assert 30 * GIB < need
    # with runtime=ray every GPU this machine sees is read: the smallest free one counts
    sharded = _cfg(model_dir, "runtime=ray", "workers.learners=2", "train.sharding=fsdp")
    two = [DeviceMemory("cuda:0", 80 * GIB, 80 * GIB), DeviceMemory("cuda:1", GIB, 80 * GIB)]
    with pytest.raises(RunDoesNotFit, match="cuda:1 has 1.0 GiB free"):
        preflight(sharded, print, memory=lambda cfg: two)


def test_warn_logs_the_refusal_and_starts_and_off_reads_nothing(model_dir) -> None:
    logged: list[str] = []
    need = preflight(_cfg(model_dir, "train.preflight=warn"), logged.append, memory=GPU(40))
    assert need is not None and need > 40 * GIB
    assert len(logged) == 1 and logged[0].startswith("warning: the learner does not fit")
    gpu = GPU(1)
    assert preflight(_cfg(model_dir, "train.preflight=off"), print, memory=gpu) is None
    assert gpu.calls == 0


def test_cpu_runs_and_models_without_a_config_are_not_checked(
    model_dir, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="replayrl.bench.preflight"):
        assert preflight(_cfg(model_dir), print, memory=lambda cfg: []) is None
    assert "the learner runs on the CPU" in caplog.text
    gpu = GPU(1)
    assert preflight(load_config("grpo", LONG_ROWS), print, memory=gpu) is None  # tiny model
    hub = load_config("grpo", [f"model.path={tmp_path / 'org-model'}", *LONG_ROWS])
    assert preflight(hub, print, memory=gpu) is None  # no local config.json to plan from
    assert gpu.calls == 0
    # on this machine the real query: a CPU learner is never checked (no child process)
    assert preflight_module.cuda_memory(_cfg(model_dir, "train.device=cpu")) == []


def test_train_refuses_before_writing_a_run_folder(
    model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from replayrl.cli.main import main

    # the seam `preflight` reads when no query is given (the GPU this machine lacks)
    monkeypatch.setattr(preflight_module, "cuda_memory", GPU(40))
    args = [f"model.path={model_dir}", *LONG_ROWS, f"logging.run_dir={tmp_path}"]
    assert main(["train", "-c", "grpo", *args, "logging.name=cli"]) == 2
    assert "the learner does not fit" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()

    from replayrl import ReplayConfig, ReplayTrainer

    api = ReplayConfig("grpo", output_dir=str(tmp_path / "api"), overrides=LONG_ROWS)
    trainer = ReplayTrainer(model=str(model_dir), reward_funcs="correctness", args=api)
    with pytest.raises(RunDoesNotFit, match="cuda:0 has 40.0 GiB free"):
        trainer.train()
    assert not (tmp_path / "api").exists()


def test_a_colocated_vllm_engine_counts_its_share_of_the_gpu(model_dir) -> None:
    fits = ["model.gradient_checkpointing=true"]
    need = preflight(_cfg(model_dir, *fits), print, GPU(80))
    assert need is not None
    free = need / GIB + 10  # 10 GiB to spare beside the learner alone
    # the same GPU with vLLM in the learner's process: its 0.3 x 80 GiB do not fit beside it
    vllm = [*fits, "rollout.backend=vllm", "vllm.gpu_memory_utilization=0.3"]
    with pytest.raises(RunDoesNotFit) as caught:
        preflight(_cfg(model_dir, *vllm), print, GPU(free))
    msg = str(caught.value)
    assert "beside the 24.0 GiB the vLLM engine in the same process reserves" in msg
    share = float(re.search(r"vllm\.gpu_memory_utilization=(0\.\d+) \(its weights", msg).group(1))
    assert share == 0.12  # 10 GiB of 80, rounded down
    assert preflight(_cfg(model_dir, *vllm, f"vllm.gpu_memory_utilization={share}"), print,
                     GPU(free)) == need  # fmt: skip
    # an engine elsewhere takes nothing from the learner's GPU: generator actors on Ray, a server
    assert preflight(_cfg(model_dir, *fits, "rollout.backend=hf"), print, GPU(free)) == need
    elsewhere = [*fits, "runtime=ray", "rollout.backend=vllm", "vllm.gpu_memory_utilization=0.3"]
    assert preflight(_cfg(model_dir, *elsewhere), print, GPU(free)) == need
    server = [*fits, "rollout.backend=vllm_server", "vllm.gpu_memory_utilization=0.3"]
    assert preflight(_cfg(model_dir, *server), print, GPU(free)) == need
