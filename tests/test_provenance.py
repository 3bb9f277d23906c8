"""A run's provenance block: git state outside a checkout, CPU parsing, the weights' hash."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from replayrl.run.records.provenance import cpu_info, git_state, machine_id, weights_sha256

TINY_WARMSTART = [  # a warm start built in a second
    "model.tiny.num_layers=1",
    "model.tiny.hidden_size=16",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=32",
    "model.warmstart.steps=2",
    "model.warmstart.mistake_steps=0",
]


def test_git_state_outside_a_checkout_is_none(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None)


def test_git_state_reads_commit_and_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "untracked.json").write_text("{}")  # results beside the code: still clean
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_state(tmp_path) == (head, True)


def test_cpu_info_parses_model_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: sse avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: sse\n"
    )
    info = cpu_info(f)
    assert info["cpu_model"] == "AMD EPYC 7B13"
    assert info["cpu_flags"] == ["avx2", "fma", "sse"]
    assert cpu_info(tmp_path / "missing")["cpu_flags"] == []


def test_weights_sha256_covers_safetensors_only(tmp_path: Path) -> None:
    assert weights_sha256(tmp_path / "nope") is None
    assert weights_sha256(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    (tmp_path / "config.json").write_text("{}")
    expected = hashlib.sha256(b"model.safetensors\0abc").hexdigest()
    assert weights_sha256(tmp_path) == expected
    (tmp_path / "config.json").write_text('{"x": 1}')  # not weights: same hash
    assert weights_sha256(tmp_path) == expected
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert weights_sha256(tmp_path) != expected


def test_machine_id_changes_with_the_cpu() -> None:
    a = {"cpu_model": "Intel Xeon", "cpu_flags": ["avx512f"], "torch": "2.13.0"}
    assert machine_id(a) == machine_id(dict(a))
    assert machine_id(a) != machine_id({**a, "cpu_model": "AMD EPYC"})
    assert machine_id(a) != machine_id({**a, "aten_cpu_capability": "AVX2"})


def test_a_runs_summary_names_its_code_machine_and_warm_start(tmp_path: Path) -> None:
    from replayrl.config.schema import load_config
    from replayrl.run.start import train

    cfg = load_config(
        "grpo",
        [
            *TINY_WARMSTART,
            "train.steps=1",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.max_new_tokens=8",
            "train.mini_batch_size=null",
            "eval.num_prompts=4",
            "train.threads=1",
            "logging.progress=false",
            "logging.tensorboard=false",
            f"logging.run_dir={tmp_path}",
            "logging.name=r",
        ],
    )
    summary = train(cfg, log=lambda _: None)
    prov = summary["provenance"]
    assert prov["warmstart_sha256"] == weights_sha256(summary["model_path"]) is not None
    assert prov["threads"] == 1 and prov["torch"] and prov["machine_id"]
    assert prov["precision"] == summary["precision"]
    assert "commit" in prov and "dirty" in prov  # None outside a git checkout
