"""Write data/easy_math.jsonl: one-step arithmetic with small numbers, bare or as a word problem.

A task SmolLM2-135M-Instruct can partly solve, for the `smollm2-gsm` preset.
Deterministic: `python scripts/make_easy_math.py` rewrites the same file.
Columns: `prompt` (text), `answer` (an integer, as text), `kind` (the template's name).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Max", "Emma", "Leo", "Zoe", "Jack", "Ava"]
ITEMS = ["apples", "pencils", "books", "stickers", "cookies", "marbles", "cards", "flowers"]


def bare_add(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(1, 9), r.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def bare_subtract(r: random.Random) -> tuple[str, int]:
    a = r.randint(3, 18)
    b = r.randint(1, min(a - 1, 9))
    return f"What is {a} - {b}?", a - b


def bare_multiply(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return f"What is {a} times {b}?", a * b


def word_add(r: random.Random) -> tuple[str, int]:
    n, item, a, b = r.choice(NAMES), r.choice(ITEMS), r.randint(1, 9), r.randint(1, 9)
    return (
        f"{n} has {a} {item}. {n} gets {b} more {item}. How many {item} does {n} have now?",
        a + b,
    )


def word_subtract(r: random.Random) -> tuple[str, int]:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    a = r.randint(3, 12)
    b = r.randint(1, a - 1)
    return f"{n} had {a} {item} and gave {b} of them away. How many {item} are left?", a - b


# kind -> (generator, rows of that kind); 300 rows in all
KINDS = {
    "bare_add": (bare_add, 60),
    "bare_subtract": (bare_subtract, 60),
    "bare_multiply": (bare_multiply, 40),
    "word_add": (word_add, 70),
    "word_subtract": (word_subtract, 70),
}


def make_rows(seed: int = 0) -> list[dict[str, str]]:
    """Distinct prompts, the kinds interleaved."""
    r = random.Random(seed)
    per_kind: dict[str, list[dict[str, str]]] = {}
    for kind, (make, count) in KINDS.items():
        seen: set[str] = set()
        rows: list[dict[str, str]] = []
        for _ in range(100 * count):
            if len(rows) == count:
                break
            prompt, answer = make(r)
            if prompt not in seen:
                seen.add(prompt)
                rows.append({"prompt": prompt, "answer": str(answer), "kind": kind})
        if len(rows) < count:
            raise ValueError(f"{kind}: only {len(rows)} distinct prompts, {count} wanted")
        per_kind[kind] = rows
    out: list[dict[str, str]] = []
    while any(per_kind.values()):
        for rows in per_kind.values():
            if rows:
                out.append(rows.pop(0))
    return out


def main() -> None:
    # shipped beside the presets that use it (data/ in the checkout is a link to that folder)
    out = Path(__file__).resolve().parents[1] / "src/replayrl/config/presets/data/easy_math.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in make_rows()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
