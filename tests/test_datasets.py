"""DatasetTask: file formats, prompt forms, answer formats, skipped rows, splits."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from replayrl.rollout.tasks.base import Task
from replayrl.rollout.tasks.datasets import DatasetTask, gsm8k_answer, load_rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def plain_rows(n: int) -> list[dict]:
    return [{"prompt": f"What is {i}+{i}?", "answer": str(2 * i), "id": i} for i in range(n)]


MESSAGES = [
    {"role": "system", "content": "Put the final answer in \\boxed{}."},
    {"role": "user", "content": "What is 6*7?"},
]


# --- file formats -----------------------------------------------------------------------


def test_jsonl_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", plain_rows(20))
    task = DatasetTask(path, eval_size=5, seed=0)
    as_task: Task = task  # the Task protocol, checked by attribute (it is not runtime-checkable)
    assert as_task.name == "dataset"
    for method in ("sample_train", "eval_rows", "is_correct", "corpus"):
        assert callable(getattr(as_task, method))
    assert (task.num_train, task.num_eval) == (15, 5)
    assert task.skipped == {}
    row = task.eval_rows()[0]
    assert set(row) == {"prompt", "answer", "id"}  # every column kept (rewards get them)
    assert row["answer"] == str(2 * row["id"]) and row["prompt"] == f"What is {row['id']}+" + (
        f"{row['id']}?"
    )


def test_parquet_file_with_messages(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"prompt": MESSAGES, "answer": "42"}] + [
        {"prompt": [{"role": "user", "content": f"{i}*2?"}], "answer": str(2 * i)} for i in range(9)
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    task = DatasetTask(path, eval_size=2, seed=1)
    assert task.num_train + task.num_eval == 10
    by_answer = {r["answer"]: r for r in task.train_rows() + task.eval_rows()}
    assert by_answer["42"]["prompt"] == MESSAGES  # messages kept as they are
    assert task.is_correct("6*7 = \\boxed{42}", by_answer["42"])


def test_csv_gsm8k_question_column(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer"])
        w.writerow(["Natalia sold 48 clips...", "48/2 = <<48/2=24>>24\n48+24 = 72\n#### 72"])
        w.writerow(["A big one", "so it is\n#### 1,234"])
        w.writerow(["Bare number", "15"])
        w.writerow(["No marker", "the answer is seventy"])  # unparseable for gsm8k
        w.writerow(["", "#### 3"])  # empty prompt
        w.writerow(["Too many cells", "#### 3", "extra"])
    task = DatasetTask(path, prompt_column="question", format="gsm8k", eval_size=0)
    rows = task.train_rows()
    assert [r["answer"] for r in rows] == ["72", "1234", "15"]
    assert rows[0]["prompt"] == "Natalia sold 48 clips..." == rows[0]["question"]
    assert rows[0]["solution"].endswith("#### 72")  # the worked solution is kept
    assert task.skipped == {"unparseable_answer": 1, "missing_prompt": 1, "bad_csv_row": 1}
    assert task.eval_rows() == []


def test_json_and_gzip_files(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text(json.dumps(plain_rows(4)))
    cols = {"prompt": ["a?", "b?"], "answer": [1, 2]}
    (tmp_path / "cols.json").write_text(json.dumps(cols))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": plain_rows(3)}))
    gz = tmp_path / "rows.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in plain_rows(5)).encode()))
    assert len(load_rows(tmp_path / "list.json")) == 4
    assert load_rows(tmp_path / "cols.json") == [
        {"prompt": "a?", "answer": 1},
        {"prompt": "b?", "answer": 2},
    ]
    assert len(load_rows(tmp_path / "wrapped.json")) == 3
    assert len(load_rows(gz)) == 5
    task = DatasetTask(tmp_path / "cols.json", eval_size=0)
    assert [r["answer"] for r in task.train_rows()] == ["1", "2"]  # numbers become text


def test_load_rows_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(tmp_path / "nope.jsonl")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown dataset file type '.txt'"):
        load_rows(tmp_path / "data.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{oops\n\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid json"):
        load_rows(bad)
    skipped: dict[str, int] = {}
    assert load_rows(bad, skipped) == [{"prompt": "a", "answer": "1"}, [1, 2]]
    assert skipped == {"invalid_json": 1}


def test_in_memory_rows_and_hf_dataset() -> None:
    task = DatasetTask(plain_rows(10), eval_size=3, seed=2)
    assert (task.num_train, task.num_eval) == (7, 3)
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(plain_rows(10))
    from_ds = DatasetTask(ds, eval_size=3, seed=2)
    assert from_ds.eval_rows() == task.eval_rows()
    with pytest.raises(ValueError, match="pick a split"):
        DatasetTask(datasets.DatasetDict({"train": ds}))


# --- prompt and answer forms ------------------------------------------------------------


def test_messages_prompts_and_bad_structures() -> None:
    rows = [
        {"prompt": MESSAGES, "answer": "42"},
        {"prompt": [{"role": "user"}], "answer": "1"},  # no content
        {"prompt": [{"role": 3, "content": "hi"}], "answer": "1"},  # role not text
        {"prompt": ["just text in a list"], "answer": "1"},  # item not a message
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "answer": "1"},
        {"prompt": [], "answer": "1"},  # no messages at all
        {"prompt": [{"role": "user", "content": "  "}], "answer": "1"},  # nothing said
        {"prompt": 17, "answer": "1"},  # neither text nor messages
    ]
    task = DatasetTask(rows, eval_size=0)
    (row,) = task.train_rows()
    assert row["prompt"] == MESSAGES
    assert row["prompt"] is not MESSAGES  # a copy: the caller's rows are not shared
    assert task.skipped == {"bad_messages": 4, "missing_prompt": 2, "bad_prompt": 1}
    assert task.corpus() == [MESSAGES[0]["content"], MESSAGES[1]["content"], "42"]


def test_math_format_boxed_solutions() -> None:
    rows = [
        {"problem": "p1", "solution": "Thus $x = \\boxed{\\frac{1}{2}}$."},
        {"problem": "p2", "solution": "First \\boxed{3}, no wait: \\boxed{\\{1, 2\\}}"},
        {"problem": "p3", "solution": "There is no box here, 5."},
        {"problem": "p4", "solution": "cut off \\boxed{\\frac{1}{2}"},
        {"problem": "p5", "answer": "\\sqrt{2}"},  # no solution: the answer column
        {"problem": "p6"},
    ]
    task = DatasetTask(rows, prompt_column="problem", format="math", eval_size=0)
    answers = {r["prompt"]: r["answer"] for r in task.train_rows()}
    assert answers == {"p1": "\\frac{1}{2}", "p2": "\\{1, 2\\}", "p5": "\\sqrt{2}"}
    assert task.skipped == {"unparseable_answer": 2, "missing_answer": 1}
    p1 = next(r for r in task.train_rows() if r["prompt"] == "p1")
    assert task.is_correct("so the answer is \\boxed{0.5}", p1)
    assert task.is_correct("so the answer is 1/2", p1)
    assert not task.is_correct("so the answer is \\boxed{0.25}", p1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48/2 = 24\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("#### $18.50.", "18.50"),
        ("#### \u22123", "-3"),
        ("#### 6 apples", "6 apples"),
        ("42", "42"),
        ("no marker", None),
        ("####   ", None),
    ],
)
def test_gsm8k_answer(text: str, expected: str | None) -> None:
    assert gsm8k_answer(text) == expected


def test_malformed_rows_counted_by_reason(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in plain_rows(3)] + [
        "[1, 2, 3]",  # not a mapping
        '"a string"',  # not a mapping
        "{broken json",
        json.dumps({"answer": "1"}),  # no prompt
        json.dumps({"prompt": "", "answer": "1"}),  # empty prompt
        json.dumps({"prompt": "q"}),  # no answer
        json.dumps({"prompt": "q", "answer": "  "}),  # empty answer
        json.dumps({"prompt": "q", "answer": None}),
        json.dumps({"prompt": "q", "answer": [1, 2]}),  # not a scalar
    ]
    path = tmp_path / "messy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    task = DatasetTask(path, eval_size=1)
    assert task.skipped == {
        "not_a_mapping": 2,
        "invalid_json": 1,
        "missing_prompt": 2,
        "missing_answer": 3,
        "unparseable_answer": 1,
    }
    summary = task.skip_summary()
    assert "\n" not in summary
    assert "2 train rows, 1 eval rows" in summary
    assert f"{path}: skipped 9 rows" in summary
    assert "invalid_json=1, missing_answer=3, missing_prompt=2" in summary


def test_no_usable_rows_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}] * 3 + [[1]])
    with pytest.raises(ValueError) as err:
        DatasetTask(path)
    msg = str(err.value)
    assert str(path) in msg and "no usable rows out of 4" in msg
    assert "missing_prompt=3" in msg and "not_a_mapping=1" in msg
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no usable rows out of 0"):
        DatasetTask(empty)
    with pytest.raises(ValueError, match="task.dataset.format: unknown format 'latex'"):
        DatasetTask(plain_rows(3), format="latex")  # type: ignore[arg-type]


# --- splits -----------------------------------------------------------------------------


def _prompts(rows: list[dict]) -> list[str]:
    return [r["prompt"] for r in rows]


def test_eval_split_deterministic_and_disjoint(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", plain_rows(100))
    a, b = DatasetTask(path, eval_size=20, seed=7), DatasetTask(path, eval_size=20, seed=7)
    c = DatasetTask(path, eval_size=20, seed=8)
    assert _prompts(a.eval_rows()) == _prompts(b.eval_rows())
    assert _prompts(a.eval_rows()) != _prompts(c.eval_rows())
    train, held = set(_prompts(a.train_rows())), set(_prompts(a.eval_rows()))
    assert len(held) == 20 and len(train) == 80 and not train & held
    rng = np.random.default_rng(0)
    assert all(r["prompt"] not in held for r in a.sample_train(500, rng))
    # the default split: 10% of the rows, at most 200
    assert DatasetTask(path).num_eval == 10
    with pytest.raises(ValueError, match="eval_size=100 leaves no training rows"):
        DatasetTask(path, eval_size=100)


def test_sample_train_is_seeded_and_uniform() -> None:
    task = DatasetTask(plain_rows(10), eval_size=2, seed=0)
    s1 = task.sample_train(2000, np.random.default_rng(3))
    s2 = task.sample_train(2000, np.random.default_rng(3))
    assert s1 == s2 and task.sample_train(0, np.random.default_rng(3)) == []
    counts: dict[str, int] = {}
    for r in s1:
        counts[r["prompt"]] = counts.get(r["prompt"], 0) + 1
    assert len(counts) == 8 and min(counts.values()) > 180  # 250 expected each
    s1[0]["answer"] = "mutated"  # rows handed out are copies
    assert "mutated" not in [r["answer"] for r in task.train_rows()]


def test_eval_path(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", plain_rows(30))
    test_rows = [{"question": f"Q{i}", "answer": f"#### {i}"} for i in range(12)]
    # a test question that also appears in the train file must leave the train split
    test_rows.append({"question": "What is 3+3?", "answer": "#### 6"})
    write_jsonl(tmp_path / "test.jsonl", test_rows + [{"question": "no answer"}])
    kw = {"prompt_column": "question", "format": "gsm8k"}
    write_jsonl(
        tmp_path / "train_q.jsonl",
        [{"question": r["prompt"], "answer": f"#### {r['answer']}"} for r in plain_rows(30)],
    )
    task = DatasetTask(tmp_path / "train_q.jsonl", eval_path=tmp_path / "test.jsonl", **kw)
    assert task.num_eval == 13 and task.num_train == 29
    assert task.skipped == {"duplicate_of_eval": 1, "missing_answer": 1}
    assert "test.jsonl: skipped 1 rows (missing_answer=1)" in task.skip_summary()
    assert _prompts(task.eval_rows())[:3] == ["Q0", "Q1", "Q2"]  # file order
    sub = DatasetTask(
        tmp_path / "train_q.jsonl", eval_path=tmp_path / "test.jsonl", eval_size=5, **kw
    )
    again = DatasetTask(
        tmp_path / "train_q.jsonl", eval_path=tmp_path / "test.jsonl", eval_size=5, **kw
    )
    assert sub.num_eval == 5 and sub.eval_rows() == again.eval_rows()
    # the same file on both sides: every train prompt is an eval prompt
    with pytest.raises(ValueError, match="no training rows left .*30 duplicate eval prompts"):
        DatasetTask(train, eval_path=train)


def test_is_correct_and_corpus() -> None:
    rows = [{"prompt": "What is 36*2?", "answer": "#### 72"}]
    task = DatasetTask(rows, format="gsm8k", eval_size=0)
    row = task.train_rows()[0]
    assert task.is_correct("36*2 = 72", row)
    assert task.is_correct("I think \\boxed{72}", row)
    assert task.is_correct("#### 72.0", row)
    assert not task.is_correct("72 no wait, 71", row)
    assert not task.is_correct("", row)
    assert task.corpus() == ["What is 36*2?", "72"]
