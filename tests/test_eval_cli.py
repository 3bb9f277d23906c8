"""`replayrl eval`: every row of a file, with a run's settings; says what it scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from replayrl.cli.main import main
from replayrl.config.schema import load_config
from replayrl.run.start import train
from tiny import TINY_RUN


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "train.steps=1",
            "train.threads=1",
            "rollout.max_new_tokens=3",
            f"logging.run_dir={root}",
            "logging.name=r",
        ],
    )
    train(cfg, log=lambda _: None)
    return root / "r"


def sums_file(path: Path, n: int) -> Path:
    rows = [{"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1)} for a in range(10, 10 + n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_scores_every_row_of_a_file_with_the_runs_settings(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # every row is scored: 12 rows, more than the run's eval.num_prompts (8)
    data = sums_file(tmp_path / "sums.jsonl", 12)
    out = tmp_path / "res.json"
    code = main(
        ["eval", "--run", str(tiny_run), "--data", str(data), "--out", str(out), "--show", "2"]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert f"every row of {data} (12 rows)" in text
    assert "correct  answer" in text and "prompt -> completion" in text  # --show 2
    res = json.loads(out.read_text())
    assert res["num_prompts"] == 12 and len(res["completions"]) == 12
    assert res["max_new_tokens"] == 3  # the run's, not the default
    assert res["run"] == str(tiny_run)
    correct = sum(c["correct"] for c in res["completions"])
    assert res["eval/accuracy"] == pytest.approx(correct / 12)
    assert all(len(c["completion"]) <= 3 * 8 for c in res["completions"])


def test_eval_with_k_reports_pass_at_k(tiny_run: Path, tmp_path: Path):
    data = sums_file(tmp_path / "few.jsonl", 3)
    out = tmp_path / "k.json"
    assert (
        main(["eval", "--run", str(tiny_run), "--data", str(data), "--k", "2", "--out", str(out)])
        == 0
    )
    res = json.loads(out.read_text())
    assert 0.0 <= res["eval/pass@2"] <= 1.0 and res["eval/pass@2"] >= res["eval/accuracy"] - 1e-9


def test_eval_of_a_model_inside_a_run_folder_uses_that_run(tiny_run: Path, tmp_path: Path):
    policy = sorted((tiny_run / "checkpoints").iterdir())[-1] / "policy"
    data = sums_file(tmp_path / "s.jsonl", 2)
    out = tmp_path / "m.json"
    assert main(["eval", "--model", str(policy), "--data", str(data), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["run"] == str(tiny_run.resolve()) and res["max_new_tokens"] == 3


def test_eval_without_data_names_the_builtin_task(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    policy = sorted((tiny_run / "checkpoints").iterdir())[-1] / "policy"
    out = tmp_path / "b.json"
    args = ["eval", "-c", str(tiny_run / "config.yaml"), "--model", str(policy)]
    assert main([*args, "--out", str(out), "eval.num_prompts=4"]) == 0
    text = capsys.readouterr().out
    assert "built-in task 'arithmetic' (2-digit addition), its held-out split, first 4 rows" in text
    assert json.loads(out.read_text())["num_prompts"] == 4


def test_eval_of_an_in_memory_run_asks_for_a_file(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run = tmp_path / "mem"
    run.mkdir()
    data = yaml.safe_load((tiny_run / "config.yaml").read_text())
    data["task"].pop("arithmetic")
    data["task"].update(name="dataset", dataset={"path": "<in-memory: Dataset of 50 rows>"})
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    assert load_config(run / "config.yaml").task.name == "dataset"
    code = main(["eval", "--run", str(run), "--model", "x"])
    assert code == 2
    assert "--data FILE" in capsys.readouterr().err


def test_a_run_ends_with_a_final_model_folder(tiny_run: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = tiny_run / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    assert AutoTokenizer.from_pretrained(final) is not None
    policy = sorted((tiny_run / "checkpoints").iterdir())[-1] / "policy"
    last = AutoModelForCausalLM.from_pretrained(policy).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, last[name]), name


@pytest.mark.parametrize("where", ["run", "final", "checkpoint"])
def test_eval_model_takes_a_run_a_final_or_a_checkpoint_folder(
    tiny_run: Path, tmp_path: Path, where: str
):
    folder = {
        "run": tiny_run,
        "final": tiny_run / "final",
        "checkpoint": sorted((tiny_run / "checkpoints").iterdir())[-1],
    }[where]
    data = sums_file(tmp_path / f"w_{where}.jsonl", 2)
    assert main(["eval", "--model", str(folder), "--data", str(data)]) == 0
    out = tiny_run / f"eval_w_{where}.json"  # the default results file: in the run folder
    res = json.loads(out.read_text())
    assert res["run"] == str(tiny_run.resolve()) and res["num_prompts"] == 2
    expected = tiny_run / "final" if where != "checkpoint" else folder / "policy"
    assert Path(res["model"]).resolve() == expected.resolve()
    out.unlink()


def test_eval_without_a_run_folder_needs_out(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "copy"
    import shutil

    shutil.copytree(tiny_run / "final", model)
    code = main(["eval", "-c", str(tiny_run / "config.yaml"), "--model", str(model)])
    assert code == 2
    assert "--out" in capsys.readouterr().err
    assert list(tmp_path.glob("eval_*.json")) == []
