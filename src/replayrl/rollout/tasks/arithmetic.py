"""Multi-digit addition: `a+b=` -> `c`. Difficulty is the number of digits per operand."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from replayrl.config.section import Section
from replayrl.rollout.tasks.base import Row


class ArithmeticConfig(Section):
    """task.name=arithmetic: its settings, under `task.arithmetic`."""

    digits: int = Field(2, ge=1, le=9, description="arithmetic: digits per operand")


def add_with_carry_errors(a: int, b: int, carry_error: float, rng: np.random.Generator) -> int:
    """Column addition where each carry is forgotten with probability `carry_error`."""
    result, place, carry = 0, 1, 0
    while a or b or carry:
        s = a % 10 + b % 10 + carry
        result += (s % 10) * place
        carry = s // 10
        if carry and rng.random() < carry_error:
            carry = 0
        a, b, place = a // 10, b // 10, place * 10
    return result


class ArithmeticTask:
    """Seeded train/eval split over all `digits`-digit addition problems."""

    name = "arithmetic"

    def __init__(self, digits: int = 2, eval_size: int = 200, seed: int = 0) -> None:
        if digits < 1:
            raise ValueError(f"task.arithmetic.digits must be >= 1 (got {digits})")
        self.digits = digits
        self.low, self.high = 0, 10**digits  # operands in [low, high)
        space = (self.high - self.low) ** 2
        if eval_size >= space // 2:
            raise ValueError(
                f"task.eval_size={eval_size} is too large for {digits}-digit problems "
                f"({space} in all); keep it under half"
            )
        rng = np.random.default_rng(seed)
        picked: set[tuple[int, int]] = set()
        while len(picked) < eval_size:
            a, b = (int(v) for v in rng.integers(self.low, self.high, size=2))
            picked.add((a, b))
        self._eval = sorted(picked)
        self._eval_set = picked

    @staticmethod
    def make_row(a: int, b: int) -> Row:
        return {"prompt": f"{a}+{b}=", "answer": str(a + b), "a": a, "b": b}

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Row]:
        rows: list[Row] = []
        while len(rows) < n:
            a, b = (int(v) for v in rng.integers(self.low, self.high, size=2))
            if (a, b) not in self._eval_set:
                rows.append(self.make_row(a, b))
        return rows

    def eval_rows(self) -> list[Row]:
        return [self.make_row(a, b) for a, b in self._eval]

    def is_correct(self, completion: str, row: Row) -> bool:
        return completion.strip() == str(row["answer"])

    def corpus(self) -> list[str]:
        return ["0123456789+= "]

    def sft_pairs(
        self, n: int, rng: np.random.Generator, carry_error: float
    ) -> list[tuple[str, str]]:
        """(prompt, completion) pairs from a teacher that sometimes forgets carries."""
        pairs = []
        for row in self.sample_train(n, rng):
            answer = add_with_carry_errors(row["a"], row["b"], carry_error, rng)
            pairs.append((row["prompt"], str(answer)))
        return pairs
