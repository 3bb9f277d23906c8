"""The task interface: rows are dicts with a `prompt` column plus answer columns (TRL style)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

Row = dict[str, Any]


class Task(Protocol):
    name: str

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Row]:
        """n training rows, never from the eval split."""
        ...

    def eval_rows(self) -> list[Row]:
        """The fixed held-out split."""
        ...

    def is_correct(self, completion: str, row: Row) -> bool:
        """Verifier: does this completion solve this row?"""
        ...

    def corpus(self) -> list[str]:
        """Text covering the task's alphabet (to train a tokenizer)."""
        ...
