"""A format reward for the `smollm2-gsm` preset, loaded as a user file (TRL's signature).

`final_answer_format`: 1.0 when the completion ends by stating its answer, i.e. its last
line is (or ends with) "The answer is N." or "\\boxed{N}"; 0.0 otherwise (no stated answer,
or cut off mid-sentence by max_new_tokens). It rewards concise replies that finish.
"""

from __future__ import annotations

import re

_FINAL = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is:?\s*\$?-?\d[\d,]*(?:\.\d+)?|\\boxed\{[^{}]+\})"
    r"[\s.!$*]*$",
    re.IGNORECASE,
)


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return str(completion[-1].get("content") or "") if completion else ""
    return str(completion or "")


def final_answer_format(prompts, completions, **kwargs) -> list[float]:
    return [float(bool(_FINAL.search(_text(c).strip()))) for c in completions]
