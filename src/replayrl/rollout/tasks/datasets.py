"""Verifiable tasks over real datasets: local JSONL / JSON / parquet / CSV files, in-memory lists
of dicts, or a `datasets.Dataset`.

Each row needs a prompt (plain text, or a list of `{role, content}` messages kept as they are:
rendering is done elsewhere) and an answer. `format` says where the answer comes from:

- `plain`: the answer column as it is (`answer_column`, default "answer");
- `gsm8k`: the text after the last `####` of the answer column (`... #### 72` -> `72`); a
  bare number is accepted too. GSM8K files name the prompt column "question":
  use `prompt_column="question"`;
- `math`: the last `\\boxed{...}` (balanced braces) of the solution column (`solution_column`,
  default "solution"); rows without a solution fall back to the answer column.

Rows keep every original column (reward functions receive them all, TRL style), plus
`prompt` and the normalised `answer`. Malformed rows are skipped and counted per reason
(`task.skipped`, `task.skip_summary()`); a source without a usable row is an error.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from replayrl.config.section import Section
from replayrl.rollout.rewards.math import answers_match, completion_text, extract_answer, last_boxed
from replayrl.rollout.tasks.base import Row

Format = Literal["plain", "gsm8k", "math"]
FORMATS: tuple[str, ...] = ("plain", "gsm8k", "math")
SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
DEFAULT_EVAL_SIZE = 200  # upper bound of the held-out split when neither size nor file is given

# skip reasons (keys of `DatasetTask.skipped`)
INVALID_JSON = "invalid_json"
NOT_UTF8 = "not_utf8"  # a line or row with bytes that are not UTF-8
BAD_CSV_ROW = "bad_csv_row"
NOT_A_MAPPING = "not_a_mapping"
MISSING_PROMPT = "missing_prompt"
BAD_PROMPT = "bad_prompt"
BAD_MESSAGES = "bad_messages"
MISSING_ANSWER = "missing_answer"
UNPARSEABLE_ANSWER = "unparseable_answer"
DUPLICATE_OF_EVAL = "duplicate_of_eval"
TOO_LONG = "too_long"  # a prompt or answer past MAX_FIELD_CHARS: never tokenised

# a cheap length check before anything is tokenised: 1M characters is far past any model's
# context (several hundred thousand tokens), while tokenising one 50 MB row took ~20 GB
MAX_FIELD_CHARS = 1_000_000


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- reading files ----------------------------------------------------------------------


def _suffix(path: Path) -> tuple[str, bool]:
    """The data suffix of a path and whether it is gzip-compressed (`x.jsonl.gz`)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        return (suffixes[-2] if len(suffixes) > 1 else ""), True
    return (suffixes[-1] if suffixes else ""), False


def _read_text(path: Path, gz: bool) -> str:
    """The file's text; bytes that are not UTF-8 become lone surrogates (surrogateescape),
    so the rows holding them are skipped and counted (NOT_UTF8), not the whole file."""
    data = path.read_bytes()
    if gz:
        data = gzip.decompress(data)
    return data.decode("utf-8-sig", errors="surrogateescape")


_BAD_BYTES = re.compile("[\udc80-\udcff]")


def _has_bad_bytes(value: Any) -> bool:
    if isinstance(value, str):
        return _BAD_BYTES.search(value) is not None
    if isinstance(value, Mapping):
        return any(_has_bad_bytes(k) or _has_bad_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_bad_bytes(v) for v in value)
    return False


# columns a dataset often keeps its prompt / answer in, suggested when the configured one is absent
PROMPT_GUESSES = ("question", "problem", "query", "instruction", "input", "text", "messages")
ANSWER_GUESSES = ("solution", "final_answer", "target", "label", "output", "response")


class SkipCounts(dict):
    """Skipped rows per reason, plus where the first one of each reason is (file:line)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, str] = {}


def _count(skipped: dict[str, int] | None, reason: str, where: str) -> None:
    if skipped is None:
        raise ValueError(f"{where}: {reason.replace('_', ' ')}")
    skipped[reason] = skipped.get(reason, 0) + 1
    if isinstance(skipped, SkipCounts):
        skipped.first.setdefault(reason, where)


def _jsonl_rows(text: str, path: Path, skipped: dict[str, int] | None) -> list[Any]:
    rows: list[Any] = []
    # split on "\n" only: str.splitlines would also split inside a JSON string holding a
    # raw U+2028 or \x1c (legal JSON), turning one good row into two broken ones
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if _has_bad_bytes(line):
            _count(skipped, NOT_UTF8, f"{path}:{lineno}")
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            _count(skipped, INVALID_JSON, f"{path}:{lineno}")
    return rows


def _json_rows(text: str, path: Path, skipped: dict[str, int] | None) -> list[Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _jsonl_rows(text, path, skipped)  # a .json file holding JSON lines
    if isinstance(data, list):
        return _drop_bad_bytes(data, path, skipped)
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1:
            only = next(iter(lists.values()))
            if all(isinstance(r, Mapping) for r in only):  # {"data": [...]} or {"train": [...]}
                return _drop_bad_bytes(only, path, skipped)
        if lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            keys = list(lists)  # column-oriented: {"prompt": [...], "answer": [...]}
            columns = zip(*lists.values(), strict=True)
            rows = [dict(zip(keys, vals, strict=True)) for vals in columns]
            return _drop_bad_bytes(rows, path, skipped)
    raise ValueError(
        f"{path}: a .json dataset must hold a list of rows, columns of equal length, "
        "or one key holding the list of rows"
    )


def _drop_bad_bytes(rows: list[Any], path: Path, skipped: dict[str, int] | None) -> list[Any]:
    """Rows of a JSON document without undecodable bytes (the others counted, by index)."""
    kept = []
    for i, row in enumerate(rows):
        if _has_bad_bytes(row):
            _count(skipped, NOT_UTF8, f"{path}: row {i}")
        else:
            kept.append(row)
    return kept


def _csv_rows(text: str, path: Path, skipped: dict[str, int] | None) -> list[Any]:
    rows: list[Any] = []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for row in reader:
        if None in row:  # more cells than header columns
            _count(skipped, BAD_CSV_ROW, f"{path}:{reader.line_num}")
            continue
        if _has_bad_bytes(row):
            _count(skipped, NOT_UTF8, f"{path}:{reader.line_num}")
            continue
        rows.append(row)
    return rows


def _parquet_rows(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs pyarrow: pip install pyarrow (or replayrl[data])"
        ) from exc
    return pq.read_table(path).to_pylist()


def load_rows(path: str | PathLike[str], skipped: dict[str, int] | None = None) -> list[Any]:
    """Rows of a .jsonl / .ndjson / .json / .parquet / .csv file (optionally .gz-compressed).

    Lines that are not valid JSON (and CSV rows with extra cells) are counted in `skipped`
    when it is given, else they raise ValueError naming the line. Rows are returned as parsed
    (a JSONL line may hold a non-object; DatasetTask counts those as `not_a_mapping`).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"dataset file not found: {p}")
    suffix, gz = _suffix(p)
    if suffix == ".parquet":
        if gz:
            raise ValueError(f"{p}: parquet files are compressed internally; do not gzip them")
        return _parquet_rows(p)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(_read_text(p, gz), p, skipped)
    if suffix == ".json":
        return _json_rows(_read_text(p, gz), p, skipped)
    if suffix == ".csv":
        return _csv_rows(_read_text(p, gz), p, skipped)
    raise ValueError(
        f"{p}: unknown dataset file type {suffix or '(no suffix)'!r} "
        f"(known: {', '.join(SUFFIXES)}, optionally .gz)"
    )


def _source_rows(source: Any, skipped: dict[str, int]) -> tuple[list[Any], str]:
    """(raw rows, a label for messages) of a path, a datasets.Dataset, or an iterable of rows."""
    if isinstance(source, (str, PathLike)):
        return load_rows(source, skipped), str(source)
    if isinstance(source, Mapping):
        raise ValueError(
            f"dataset source is a mapping (keys: {', '.join(map(str, list(source)[:5]))}); "
            "for a DatasetDict pick a split, e.g. ds['train']"
        )
    if hasattr(source, "column_names") and hasattr(source, "to_list"):  # datasets.Dataset
        rows = source.to_list()
        return rows, f"<{type(source).__name__} of {len(rows)} rows>"
    if hasattr(source, "columns") and hasattr(source, "to_dict"):  # pandas.DataFrame
        rows = source.to_dict("records")
        return rows, f"<{type(source).__name__} of {len(rows)} rows>"
    if isinstance(source, Iterable) and not isinstance(source, (bytes, bytearray)):
        rows = list(source)
        return rows, f"<list of {len(rows)} rows>"
    raise TypeError(
        f"dataset source must be a file path, a list of dicts or a datasets.Dataset "
        f"(got {type(source).__name__})"
    )


# --- row validation ---------------------------------------------------------------------


def _chars(value: Any) -> int:
    """Characters of a text field, or of a chat's message contents (cheap, no tokenising)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(m.get("content")) if isinstance(m, Mapping) else 0 for m in value)
    return 0


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):  # empty cells from pandas / parquet
        return True
    return isinstance(value, str) and not value.strip()


def _as_list(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()  # numpy arrays from pandas
    return value


def _prompt(value: Any) -> str | list[dict[str, Any]]:
    if _is_missing(value):
        raise _Skip(MISSING_PROMPT)
    if isinstance(value, str):
        return value
    value = _as_list(value)
    if not isinstance(value, (list, tuple)):
        raise _Skip(BAD_PROMPT)
    if not value:
        raise _Skip(MISSING_PROMPT)
    messages = []
    for m in value:
        if not isinstance(m, Mapping):
            raise _Skip(BAD_MESSAGES)
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role.strip() or not isinstance(content, str):
            raise _Skip(BAD_MESSAGES)
        messages.append(dict(m))
    if not any(m["content"].strip() for m in messages):
        raise _Skip(MISSING_PROMPT)
    return messages


def _scalar_text(value: Any) -> str:
    if _is_missing(value):
        raise _Skip(MISSING_ANSWER)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        if hasattr(value, "item"):  # numpy scalar
            value = value.item()
        else:
            raise _Skip(UNPARSEABLE_ANSWER)
    return str(value).strip()


_PLAIN_NUMBER = re.compile(r"^(-?)\$?\s*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?$")


def _plain_number(text: str) -> str | None:
    """`72`, `-3`, `1,234`, `$5.50` -> the number without `$` or separators; else None."""
    m = _PLAIN_NUMBER.match(text.strip().replace("\u2212", "-"))
    return f"{m.group(1)}{m.group(2).replace(',', '')}{m.group(3) or ''}" if m else None


def gsm8k_answer(text: str) -> str | None:
    """`... #### 72` -> `72` (thousands separators dropped); a bare number as it is; else None."""
    if "####" not in text:
        return _plain_number(text)
    tail = text.rsplit("####", 1)[1].strip()
    line = tail.splitlines()[0].strip().rstrip(".").strip() if tail else ""
    if not line:
        return None
    return _plain_number(line) or line


def _answer(raw: Mapping[str, Any], fmt: str, answer_column: str, solution_column: str) -> str:
    if fmt == "math":
        solution = raw.get(solution_column)
        if not _is_missing(solution):
            if not isinstance(solution, str):
                raise _Skip(UNPARSEABLE_ANSWER)
            boxed = last_boxed(solution)
            if not boxed:
                raise _Skip(UNPARSEABLE_ANSWER)
            return boxed
        text = _scalar_text(raw.get(answer_column))  # no solution: the answer column
        boxed = last_boxed(text)
        return boxed if boxed else text
    text = _scalar_text(raw.get(answer_column))
    if fmt == "gsm8k":
        found = gsm8k_answer(text)
        if not found:
            raise _Skip(UNPARSEABLE_ANSWER)
        return found
    return text


def _prompt_key(prompt: str | list[dict[str, Any]]) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class DatasetConfig(Section):
    """task.name=dataset: where its rows come from and how they are read, under
    `task.dataset`."""

    path: str | None = None  # a JSONL, JSON, parquet or CSV file
    eval_path: str | None = None  # a separate held-out file (else a seeded split)
    prompt_column: str = "prompt"  # text, or a list of {role, content} messages
    answer_column: str = Field("answer", description="dataset column with the answer")
    solution_column: str = "solution"  # format=math: the answer is its last \boxed{}
    format: Format = "plain"  # gsm8k: the answer after "####"; math: the last \boxed{}


# --- the task ---------------------------------------------------------------------------


class DatasetTask:
    """A verifiable task over dataset rows, graded with the math grader (`rewards.math`)."""

    def __init__(
        self,
        source: Any,
        *,
        eval_path: str | PathLike[str] | None = None,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        solution_column: str = "solution",
        format: Format = "plain",
        eval_size: int | None = None,
        seed: int = 0,
        name: str = "dataset",
        require_answer: bool = True,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(
                f"task.dataset.format: unknown format {format!r} (known: {', '.join(FORMATS)})"
            )
        if eval_size is not None and (isinstance(eval_size, bool) or eval_size < 0):
            raise ValueError(f"task.eval_size must be >= 0 (got {eval_size!r})")
        self.name = name
        self.format = format
        self.prompt_column, self.answer_column = prompt_column, answer_column
        self.solution_column = solution_column
        # False: rows without an answer are kept (answer None) for reward functions that
        # need none (format or judge rewards); the verifier then grades them wrong
        self.require_answer = require_answer
        self.seed = seed
        self.skipped: dict[str, int] = {}
        self.skipped_by_source: dict[str, dict[str, int]] = {}
        self.first_skip: dict[str, str] = {}  # reason -> file:line of its first skipped row

        rows, self.source_label = self._load(source)
        if eval_path is not None:
            eval_rows, self.eval_label = self._load(eval_path)
            if eval_size is not None and eval_size < len(eval_rows):
                rng = np.random.default_rng(seed)
                keep = sorted(int(i) for i in rng.permutation(len(eval_rows))[:eval_size])
                eval_rows = [eval_rows[i] for i in keep]
            train_rows = rows
        else:
            self.eval_label = None
            n = len(rows)
            k = min(DEFAULT_EVAL_SIZE, n // 10) if eval_size is None else eval_size
            if k >= n:
                raise ValueError(
                    f"dataset {self.source_label}: task.eval_size={k} leaves no training rows "
                    f"({n} usable rows); lower it or give task.dataset.eval_path"
                )
            rng = np.random.default_rng(seed)
            held = {int(i) for i in rng.permutation(n)[:k]}
            eval_rows = [r for i, r in enumerate(rows) if i in held]
            train_rows = [r for i, r in enumerate(rows) if i not in held]
        # the same prompt twice in the data must not land on both sides of the split
        eval_keys = {_prompt_key(r["prompt"]) for r in eval_rows}
        self._train = [r for r in train_rows if _prompt_key(r["prompt"]) not in eval_keys]
        dropped = len(train_rows) - len(self._train)
        if dropped:
            self._add_skips(self.source_label, {DUPLICATE_OF_EVAL: dropped})
        if not self._train:
            raise ValueError(
                f"dataset {self.source_label}: no training rows left once the eval split is "
                f"removed ({len(train_rows)} usable, {dropped} duplicate eval prompts)"
            )
        self._eval = eval_rows

    # loading ---------------------------------------------------------------------------

    def _add_skips(self, label: str, counts: Mapping[str, int]) -> None:
        per = self.skipped_by_source.setdefault(label, {})
        for reason, c in counts.items():
            if c:
                per[reason] = per.get(reason, 0) + c
                self.skipped[reason] = self.skipped.get(reason, 0) + c

    def _load(self, source: Any) -> tuple[list[Row], str]:
        skipped = SkipCounts()
        raw_rows, label = _source_rows(source, skipped)
        for reason, where in skipped.first.items():
            self.first_skip.setdefault(reason, where)
        counts: Counter[str] = Counter(skipped)
        rows: list[Row] = []
        for raw in raw_rows:
            try:
                rows.append(self._row(raw))
            except _Skip as skip:
                counts[skip.reason] += 1
        self._add_skips(label, counts)
        if not rows:
            total = len(raw_rows) + sum(skipped.values())
            detail = _format_counts(counts) or "the source is empty"
            raise ValueError(
                f"dataset {label}: no usable rows out of {total} "
                f"(format={self.format!r}, prompt_column={self.prompt_column!r}, "
                f"answer_column={self.answer_column!r}; skipped: {detail})"
                + self._missing_columns(raw_rows)
            )
        return rows, label

    def _missing_columns(self, raw_rows: list[Any]) -> str:
        """'. It has no 'prompt' column (its columns: ...): set ...' when a configured column
        is in no row: the usual first-run mistake, answered with the key that fixes it."""
        present: dict[str, None] = {}  # insertion-ordered set: the columns as the data has them
        for raw in raw_rows[:1000]:
            if isinstance(raw, Mapping):
                present.update(dict.fromkeys(str(k) for k in raw))
        if not present:
            return ""
        wanted = [("prompt_column", self.prompt_column)]
        if self.require_answer:
            wanted.append(("answer_column", self.answer_column))
        missing = [(key, col) for key, col in wanted if col not in present]
        if not missing:
            return ""
        fixes = []
        for key, col in missing:
            guesses = PROMPT_GUESSES if key == "prompt_column" else ANSWER_GUESSES
            guess = next((c for c in guesses if c in present), None)
            example = guess or "<column>"
            fixes.append(
                f"no {col!r} column: set task.dataset.{key}={example} "
                f"(Python: ReplayConfig(..., task__dataset__{key}={example!r}))"
            )
        return f". The rows have the columns {', '.join(present)}; " + "; ".join(fixes)

    def _row(self, raw: Any) -> Row:
        if not isinstance(raw, Mapping):
            raise _Skip(NOT_A_MAPPING)
        for col in (self.prompt_column, self.answer_column):
            if _chars(raw.get(col)) > MAX_FIELD_CHARS:
                raise _Skip(TOO_LONG)
        prompt = _prompt(raw.get(self.prompt_column))
        answer: str | None = None
        columns = (self.answer_column, self.solution_column)
        if self.require_answer or not all(_is_missing(raw.get(c)) for c in columns):
            answer = _answer(raw, self.format, self.answer_column, self.solution_column)
        row: Row = {str(k): v for k, v in raw.items()}
        raw_answer = raw.get(self.answer_column)
        if self.format == "gsm8k" and isinstance(raw_answer, str) and raw_answer.strip() != answer:
            row.setdefault(self.solution_column, raw_answer)  # keep the worked solution
        row["prompt"] = prompt
        if answer is not None:  # a prompt-only row: reward functions get no answer column
            row["answer"] = answer
        return row

    # the Task protocol -----------------------------------------------------------------

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Row]:
        """n training rows drawn uniformly (with replacement) from the train split."""
        if n <= 0:
            return []
        idx = rng.integers(0, len(self._train), size=n)
        return [dict(self._train[int(i)]) for i in idx]

    def eval_rows(self) -> list[Row]:
        """The fixed held-out split (the same rows, in the same order, for a given seed)."""
        return [dict(r) for r in self._eval]

    def train_rows(self) -> list[Row]:
        """The whole train split (e.g. for an SFT warm start)."""
        return [dict(r) for r in self._train]

    @classmethod
    def to_score(cls, source: Any, task_cfg: Any) -> DatasetTask:
        """Every usable row of `source` (nothing held out: `train_rows()` are the rows to
        score), read with the columns and answer format of a config's `task.dataset` (their
        defaults when the config's task is another)."""
        own = task_cfg.settings
        columns = own if isinstance(own, DatasetConfig) else DatasetConfig()
        return cls(
            source,
            prompt_column=columns.prompt_column,
            answer_column=columns.answer_column,
            solution_column=columns.solution_column,
            format=columns.format,
            eval_size=0,
            seed=task_cfg.seed,
        )

    def is_correct(self, completion: Any, row: Row) -> bool:
        """Does the completion's final answer (boxed / #### / last number) match row['answer']?"""
        return answers_match(extract_answer(completion_text(completion)), row.get("answer"))

    def corpus(self) -> list[str]:
        """Prompt texts (every message's content) and answers, to train a tokenizer."""
        texts: list[str] = []
        for r in [*self._train, *self._eval]:
            p = r["prompt"]
            if isinstance(p, str):
                texts.append(p)
            else:
                texts.extend(m["content"] for m in p)
            if r.get("answer") is not None:
                texts.append(str(r["answer"]))
        return texts

    # reporting -------------------------------------------------------------------------

    @property
    def num_train(self) -> int:
        return len(self._train)

    @property
    def num_eval(self) -> int:
        return len(self._eval)

    def skip_summary(self) -> str:
        """One line: split sizes and the rows skipped per source and reason."""
        parts = []
        labels = [self.source_label] + ([self.eval_label] if self.eval_label else [])
        for label in labels:
            counts = self.skipped_by_source.get(label, {})
            total = sum(counts.values())
            detail = f" ({_format_counts(counts)})" if total else ""
            parts.append(f"{label}: skipped {total} rows{detail}")
        where = "".join(f"; first {r} at {w}" for r, w in sorted(self.first_skip.items()))
        return (
            f"dataset task {self.name!r} [{self.format}]: {self.num_train} train rows, "
            f"{self.num_eval} eval rows; " + "; ".join(parts) + where
        )


def _format_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason}={c}" for reason, c in sorted(counts.items()) if c)
