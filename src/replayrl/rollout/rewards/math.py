"""Math answer extraction and grading, plus TRL-signature math rewards.

`extract_answer` pulls the final answer out of a completion (last `\\boxed{...}`, else the
text after `####`, else the last number). `answers_match` compares two answers with
`math_verify` when it is installed (symbolic equivalence: LaTeX, fractions, sets, units) and
always also with a dependency-free fallback (exact rational comparison of numbers, then
normalised string equality), so a grader missing or failing on one form does not turn a
right answer into a wrong one.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

# --- extraction -------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2012": "-", "\ufe63": "-"})

# A number in running text: an optional sign (not part of `5-3`), then a LaTeX fraction,
# a fraction a/b, a number with thousands separators, or a plain integer / decimal.
_NUM_BODY = (
    r"\\[dt]?frac\{\s*-?\d+\s*\}\{\s*\d+\s*\}"
    r"|\d+\s*/\s*\d+(?!\d|\.\d)"
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d|,\d)"
    r"|\d+(?:\.\d+)?"
    r"|\.\d+"
)
_NUMBER = re.compile(r"(?:(?<![\w)\]}.])-\s?)?(?:" + _NUM_BODY + r")")
_LATEX_FRAC = re.compile(r"^(-?)\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}$")


def _balanced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the `{...}` opening at text[start] and the index after it; None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def boxed_contents(text: str) -> list[str]:
    """Contents of every complete `\\boxed{...}` / `\\fbox{...}` (balanced braces), in order."""
    found: list[tuple[int, str]] = []
    for cmd in _BOX_COMMANDS:
        pos = text.find(cmd)
        while pos != -1:
            j = pos + len(cmd)
            while j < len(text) and text[j] == " ":
                j += 1
            if j < len(text) and text[j] == "{":
                group = _balanced_group(text, j)
                if group is not None:
                    found.append((pos, group[0].strip()))
            elif cmd == "\\boxed" and j > pos + len(cmd) and j < len(text):
                # `\boxed 5`: the argument is the next token
                m = re.match(r"[^\s$]+", text[j:])
                if m:
                    found.append((pos, m.group(0)))
            pos = text.find(cmd, pos + 1)
    return [c for _, c in sorted(found)]


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` in text (balanced braces), or None."""
    boxed = boxed_contents(text)
    return boxed[-1] if boxed else None


def _clean_number(raw: str) -> str:
    s = re.sub(r"\s+", "", raw.translate(_MINUS_SIGNS))
    m = _LATEX_FRAC.match(s)
    if m:
        sign = "-" if (m.group(1) == "-") != m.group(2).startswith("-") else ""
        return f"{sign}{m.group(2).lstrip('-')}/{m.group(3)}"
    return s.replace(",", "")


def last_number(text: str) -> str | None:
    """The last number in text, normalised: `1,234` -> `1234`, `\\frac{3}{4}` -> `3/4`."""
    matches = _NUMBER.findall(text.translate(_MINUS_SIGNS))
    return _clean_number(matches[-1]) if matches else None


def extract_answer(text: str | None) -> str | None:
    """Last `\\boxed{...}` if any, else the text after the last `####`, else the last number."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed:
        return boxed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        line = tail.splitlines()[0].strip() if tail else ""
        line = line.rstrip(".").strip()
        if line:
            return _clean_number(line) if _NUMBER.fullmatch(line) else line
    return last_number(text)


# --- comparison -------------------------------------------------------------------------

_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}")
_NUMERIC_ANSWER = re.compile(
    r"^(?P<num>-?(?:\d+/\d+|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+))"
    r"(?P<unit>(?:cm|mm|km|m|kg|mg|g|ml|l|s|h|min|ft|in|lb|lbs|oz|mph|km/h|m/s|\u00b0[CF]?)?"
    r"(?:\s+[a-zA-Z\u00b0][a-zA-Z\u00b0./]*)*)$"
)
# words after a number that are mathematics, not units: `5 pi` is not 5
_NOT_UNITS = {"pi", "i", "e", "sqrt", "x", "y", "z", "n", "k", "inf", "infinity", "times"}


def _strip_latex(s: str) -> str:
    s = s.translate(_MINUS_SIGNS).strip()
    inner = last_boxed(s)
    if inner is not None and s.startswith(("\\boxed", "\\fbox")):
        s = inner
    s = s.strip().strip("$").strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2]
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\displaystyle"):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")
    for _ in range(3):
        s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.strip().rstrip(".").strip()
    # `x = 5` -> `5` (a single variable name on the left)
    m = re.match(r"^[a-zA-Z]\w*\s*=\s*(.+)$", s)
    if m and "=" not in m.group(1):
        s = m.group(1).strip()
    return s


def _as_fraction(s: str) -> Fraction | None:
    """Exact value of a numeric answer (trailing unit words ignored), else None."""
    s = _strip_latex(s)
    m = _LATEX_FRAC.match(s.replace(" ", ""))
    if m:
        s = _clean_number(s)
    m = _NUMERIC_ANSWER.match(s.strip())
    if not m or _NOT_UNITS.intersection(m.group("unit").lower().split()):
        return None
    num = m.group("num").replace(",", "")
    try:
        if "/" in num:
            a, b = num.split("/")
            return Fraction(int(a), int(b)) if int(b) != 0 else None
        return Fraction(num)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise_text(s: str) -> str:
    s = re.sub(r"\s+", "", _strip_latex(s)).lower()
    m = re.fullmatch(r"\(([a-z])\)", s)  # a multiple-choice letter: `(B)` -> `b`
    return m.group(1) if m else s


def fallback_match(pred: str, gold: str) -> bool:
    """Dependency-free comparison: exact rational equality of numbers, else normalised text."""
    a, b = _as_fraction(pred), _as_fraction(gold)
    if a is not None and b is not None:
        return a == b
    na, nb = _normalise_text(pred), _normalise_text(gold)
    return bool(na) and na == nb


def _math_verify_match(pred: str, gold: str) -> bool | None:
    """math_verify's verdict, or None when it is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    # math_verify times out with signal.alarm, which only works in the main thread
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        parsed = []
        for s in (gold, pred):
            # both are already-extracted answers: boxing them makes math_verify read the whole
            # expression (bare `2x` would otherwise be read as the number 2)
            p = parse(f"\\boxed{{{s}}}", parsing_timeout=timeout)
            if not p:
                p = parse(s, parsing_timeout=timeout)
            if not p:
                return False
            parsed.append(p)
        return bool(verify(parsed[0], parsed[1], timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a grader crash is "not shown equal", not a run failure
        return False


def answers_match(pred: str | None, gold: Any) -> bool:
    """True when the predicted answer equals the gold one (math_verify, then the fallback)."""
    if pred is None or gold is None:
        return False
    pred_s = str(pred).translate(_MINUS_SIGNS).strip()
    gold_s = str(gold).translate(_MINUS_SIGNS).strip()
    if not pred_s or not gold_s:
        return False
    if fallback_match(pred_s, gold_s):
        return True
    return bool(_math_verify_match(pred_s, gold_s))


# --- rewards (TRL signature) -----------------------------------------------------------


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or the last message's content (TRL conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        last = completion[-1]
        if isinstance(last, dict):
            return str(last.get("content") or "")
    return "" if completion is None else str(completion)


def gold_answer(answer: Any) -> str | None:
    """The gold answer of a row; raw `#### 72` or `\\boxed{}` solutions are reduced to it."""
    if answer is None:
        return None
    s = str(answer).strip()
    if not s:
        return None
    if "####" in s or last_boxed(s) is not None:
        return extract_answer(s)
    return s


def math_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **_: Any
) -> list[float | None]:
    """1.0 when the completion's extracted answer matches `answer`, else 0.0 (None: no answer)."""
    out: list[float | None] = []
    for c, a in zip(completions, answer, strict=True):
        gold = gold_answer(a)
        out.append(
            None if gold is None else float(answers_match(extract_answer(completion_text(c)), gold))
        )
    return out


def boxed_format_reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    """1.0 when the completion contains a complete, non-empty `\\boxed{...}`, else 0.0."""
    return [float(bool(last_boxed(completion_text(c)))) for c in completions]


_ANSWER_TAG = re.compile(r"<answer>\s*\S.*?</answer>", re.DOTALL)


def answer_tag_format_reward(
    prompts: list[Any], completions: list[Any], **_: Any
) -> list[float | None]:
    """1.0 when the completion has a non-empty `<answer>...</answer>` pair, else 0.0."""
    return [float(bool(_ANSWER_TAG.search(completion_text(c)))) for c in completions]
