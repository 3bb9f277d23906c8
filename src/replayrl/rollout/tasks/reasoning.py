"""Built-in reasoning tasks: the model writes its working, the reward checks the final answer.

Three operations, each a chain of small local steps written out in full, then `#answer`:

- `add` (column addition, least significant column first, carries written out):
  `47+586=` -> `7+6=13,r3;4+8+1=13,r33;0+5+1=6,r633;#633`
  Each column is `x+y[+1]=s` (`+1`: the carry from the column before) and `,r...` the
  result so far (this column's last digit in front of the previous result).
- `sub` (column subtraction, a >= b, borrows written out):
  `503-47=` -> `13-7=6,r6;10-4-1=5,r56;5-0-1=4,r456;#456`
  A column that borrows writes its top digit with a `1` in front (`13-7`); the next column
  pays it back (`-1`).
- `chain` (running sums and differences, never below zero):
  `38+7-19+64=` -> `38+7=45;45-19=26;26+64=90;#90`

Difficulty knobs: `digits` (largest operand), `min_digits` (smallest), `terms` (chain length,
`chain` only). Operand lengths vary between `min_digits` and `digits`, and the teacher's
traces vary in style (an `explicit` style pads short operands with zeros and writes `+0` /
`-0` for no carry; a `compact` one does not), so correct answers come from shorter or longer
traces.

The SFT teacher (`sft_pairs`) makes realistic, fixable mistakes, each with probability
`error_rate`: it forgets a carry (add, chain) or a borrow (sub), and it gets a fixed fifth of
the single-digit facts wrong by one (`confused`: shaky table entries, each to be fixed on its
own), then carries on consistently from its wrong column, as a student would. The held-out
split is a seeded set of problems that training never samples.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
from pydantic import Field

from replayrl.config.section import Section
from replayrl.rollout.rewards.builtin import ANSWER_MARK, final_answer
from replayrl.rollout.tasks.base import Row

OPS = ("add", "sub", "chain")


class ReasoningConfig(Section):
    """task.name=reasoning: its settings, under `task.reasoning` (operand lengths
    min_digits..digits; terms: the length of a chain)."""

    op: Literal["add", "sub", "chain"] = Field("add", description="reasoning: the operation")
    digits: int = Field(2, ge=1, le=6, description="reasoning: longest operand (digits)")
    min_digits: int = Field(1, ge=1, le=6, description="reasoning: shortest operand (digits)")
    terms: int = Field(4, ge=3, le=8, description="reasoning, op chain: terms in the chain")


ALPHABET = "0123456789+-=,;r#"


def confused(x: int, y: int) -> bool:
    """The teacher's shaky facts: a fixed fifth of the digit pairs (x, y) it sometimes gets
    wrong by one (like a student's few wrong table entries); the same for every seed."""
    return (3 * x + 7 * y) % 5 == 2


def _slip(value: int, x: int, y: int, error_rate: float, rng: np.random.Generator | None) -> int:
    """A shaky fact is written one too high (one too low for 9s) with probability error_rate."""
    if rng is None or not error_rate or not confused(x, y) or rng.random() >= error_rate:
        return value
    return value + 1 if value % 10 != 9 else value - 1


def _number(rng: np.random.Generator, min_digits: int, max_digits: int) -> int:
    k = int(rng.integers(min_digits, max_digits + 1))
    low = 0 if k == 1 else 10 ** (k - 1)
    return int(rng.integers(low, 10**k))


def _digits(n: int, width: int) -> list[int]:
    """Digits of n, least significant first, padded with zeros to `width`."""
    return [(n // 10**i) % 10 for i in range(width)]


def add_trace(
    a: int, b: int, *, explicit: bool, error_rate: float, rng: np.random.Generator | None
) -> tuple[str, int]:
    """Column addition written out; each carry forgotten with probability `error_rate`."""
    width = max(len(str(a)), len(str(b)))
    xs, ys = _digits(a, width), _digits(b, width)
    la, lb = len(str(a)), len(str(b))
    steps, result, carry = [], "", 0
    for i in range(width):
        if carry and rng is not None and error_rate and rng.random() < error_rate:
            carry = 0  # the mistake: the carry from the column before is forgotten
        terms = [
            str(xs[i]) if (explicit or i < la) else "",
            str(ys[i]) if (explicit or i < lb) else "",
        ]
        terms = [t for t in terms if t]
        if carry or explicit:
            terms.append(str(carry))
        s = _slip(xs[i] + ys[i] + carry, xs[i], ys[i], error_rate, rng)
        result = str(s % 10) + result
        steps.append(f"{'+'.join(terms)}={s},r{result}")
        carry = s // 10
    if carry and not (rng is not None and error_rate and rng.random() < error_rate):
        result = "1" + result
        steps.append(f"{'0+0+1' if explicit else '1'}=1,r{result}")
    value = int(result)
    return ";".join(steps) + f";{ANSWER_MARK}{value}", value


def sub_trace(
    a: int, b: int, *, explicit: bool, error_rate: float, rng: np.random.Generator | None
) -> tuple[str, int]:
    """Column subtraction (a >= b) written out; each borrow forgotten with `error_rate`."""
    width = len(str(a))
    xs, ys = _digits(a, width), _digits(b, width)
    lb = len(str(b))
    steps, result, borrow = [], "", 0
    for i in range(width):
        if borrow and rng is not None and error_rate and rng.random() < error_rate:
            borrow = 0  # the mistake: the borrow taken by the column before is not paid back
        need = xs[i] - ys[i] - borrow < 0
        top = xs[i] + 10 * need
        terms = [str(top)]
        if explicit or i < lb:
            terms.append(str(ys[i]))
        if borrow or explicit:
            terms.append(str(borrow))
        d = _slip(top - ys[i] - borrow, xs[i], ys[i], error_rate, rng)
        result = str(d) + result
        steps.append(f"{'-'.join(terms)}={d},r{result}")
        borrow = int(need)
    # a forgotten borrow can leave one unpaid at the top: the student just drops it
    value = int(result)
    return ";".join(steps) + f";{ANSWER_MARK}{value}", value


def _add_sloppy(a: int, b: int, error_rate: float, rng: np.random.Generator | None) -> int:
    """a + b column by column, each carry forgotten with probability `error_rate`."""
    out, place, carry = 0, 1, 0
    while a or b or carry:
        s = _slip(a % 10 + b % 10 + carry, a % 10, b % 10, error_rate, rng)
        out += (s % 10) * place
        carry = s // 10
        if carry and rng is not None and error_rate and rng.random() < error_rate:
            carry = 0
        a, b, place = a // 10, b // 10, place * 10
    return out


def _sub_sloppy(a: int, b: int, error_rate: float, rng: np.random.Generator | None) -> int:
    """a - b (a >= b) column by column, each borrow forgotten with probability `error_rate`."""
    out, place, borrow = 0, 1, 0
    while a or b:
        d = a % 10 - b % 10 - borrow
        borrow = int(d < 0)
        d = _slip(d + 10 * borrow, a % 10, b % 10, error_rate, rng)
        out += d * place
        if borrow and rng is not None and error_rate and rng.random() < error_rate:
            borrow = 0
        a, b, place = a // 10, b // 10, place * 10
    return out


def chain_trace(
    start: int,
    ops: list[tuple[str, int]],
    *,
    error_rate: float,
    rng: np.random.Generator | None,
) -> tuple[str, int]:
    """Running sums/differences written out; each step's carries/borrows may be forgotten."""
    steps, value = [], start
    for op, n in ops:
        if op == "+":
            new = _add_sloppy(value, n, error_rate, rng)
        else:
            # a student's slip can make the running value smaller than n: clamp at 0, the
            # answer is wrong anyway
            new = _sub_sloppy(value, n, error_rate, rng) if value >= n else 0
        steps.append(f"{value}{op}{n}={new}")
        value = new
    return ";".join(steps) + f";{ANSWER_MARK}{value}", value


class ReasoningTask:
    """A seeded family of written-out arithmetic problems (see the module docstring)."""

    name = "reasoning"

    def __init__(
        self,
        op: str = "add",
        digits: int = 3,
        min_digits: int = 1,
        terms: int = 4,
        eval_size: int = 200,
        seed: int = 0,
    ) -> None:
        if op not in OPS:
            raise ValueError(
                f"task.reasoning.op: unknown operation {op!r} (known: {', '.join(OPS)})"
            )
        if not 1 <= min_digits <= digits:
            raise ValueError(
                f"task.reasoning.min_digits={min_digits} must be between 1 and "
                f"task.reasoning.digits={digits}"
            )
        if digits > 6:
            raise ValueError(f"task.reasoning.digits={digits}: at most 6")
        if op == "chain" and not 3 <= terms <= 8:
            raise ValueError(f"task.reasoning.terms={terms}: chain needs 3 to 8 terms")
        self.op, self.digits, self.min_digits, self.terms = op, digits, min_digits, terms
        space = self._space()
        if eval_size >= space // 2:
            raise ValueError(
                f"task.eval_size={eval_size} is too large for this task ({space} problems in "
                "all); keep it under half"
            )
        rng = np.random.default_rng(seed)
        picked: dict[str, Row] = {}
        while len(picked) < eval_size:
            row = self._draw(rng)
            picked.setdefault(row["prompt"], row)
        self._eval = [picked[k] for k in sorted(picked)]
        self._eval_prompts = set(picked)

    def _space(self) -> int:
        """A lower bound on the number of distinct problems (for the eval_size check)."""
        per = 10**self.digits - (10 ** (self.min_digits - 1) if self.min_digits > 1 else 0)
        if self.op == "chain":
            return per**self.terms
        return per * per // (2 if self.op == "sub" else 1)

    def _draw(self, rng: np.random.Generator) -> Row:
        lo, hi = self.min_digits, self.digits
        if self.op == "chain":
            start = _number(rng, lo, hi)
            ops, value = [], start
            for _ in range(self.terms - 1):
                n = _number(rng, lo, hi)
                op = "-" if n <= value and rng.random() < 0.5 else "+"
                value = value + n if op == "+" else value - n
                ops.append((op, n))
            prompt = str(start) + "".join(f"{o}{n}" for o, n in ops) + "="
            # the operations as text (`+7-19+64`): rows must fit in Arrow tables (TRL peer)
            terms = "".join(f"{o}{n}" for o, n in ops)
            return {"prompt": prompt, "answer": str(value), "start": start, "ops": terms}
        a, b = _number(rng, lo, hi), _number(rng, lo, hi)
        if self.op == "sub":
            a, b = max(a, b), min(a, b)
            return {"prompt": f"{a}-{b}=", "answer": str(a - b), "a": a, "b": b}
        return {"prompt": f"{a}+{b}=", "answer": str(a + b), "a": a, "b": b}

    # the Task protocol -----------------------------------------------------------------

    def sample_train(self, n: int, rng: np.random.Generator) -> list[Row]:
        rows: list[Row] = []
        while len(rows) < n:
            row = self._draw(rng)
            if row["prompt"] not in self._eval_prompts:
                rows.append(row)
        return rows

    def eval_rows(self) -> list[Row]:
        return [dict(r) for r in self._eval]

    def is_correct(self, completion: str, row: Row) -> bool:
        return final_answer(completion) == str(row["answer"])

    def corpus(self) -> list[str]:
        return [ALPHABET]

    # the warm start's teacher ----------------------------------------------------------

    def trace(
        self,
        row: Row,
        *,
        explicit: bool = False,
        error_rate: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> str:
        """The worked solution of `row` (a teacher that forgets carries at `error_rate`)."""
        if self.op == "chain":
            ops = [(o, int(n)) for o, n in re.findall(r"([+-])(\d+)", row["ops"])]
            return chain_trace(row["start"], ops, error_rate=error_rate, rng=rng)[0]
        fn = sub_trace if self.op == "sub" else add_trace
        return fn(row["a"], row["b"], explicit=explicit, error_rate=error_rate, rng=rng)[0]

    def sft_pairs(
        self, n: int, rng: np.random.Generator, error_rate: float
    ) -> list[tuple[str, str]]:
        """(prompt, worked completion) pairs; half the traces in the explicit style."""
        return [
            (
                row["prompt"],
                self.trace(row, explicit=bool(rng.random() < 0.5), error_rate=error_rate, rng=rng),
            )
            for row in self.sample_train(n, rng)
        ]
