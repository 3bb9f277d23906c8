"""Turn a task row's prompt (plain text or `{role, content}` messages) into the text generated from.

Rules (`render_prompt`):

- the tokenizer has a chat template and `use_chat_template` is on: the prompt becomes
  messages (plain text = one user message), the system prompt is put first unless the
  messages already start with a system message (the row's own wins), and the template
  renders them with the assistant's generation prompt
  (`apply_chat_template(..., tokenize=False, add_generation_prompt=True)`);
- otherwise (no template, e.g. the tiny demo's character tokenizer, or the switch is off):
  plain text without a system prompt passes through unchanged; anything else (messages, or
  a system prompt) is written one message a line as `role: content`, followed by a last
  line `assistant:` that cues the answer.

Rows keep their original prompt: reward functions receive it as it was (as in TRL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Messages = list[dict[str, Any]]
Prompt = str | Sequence[Mapping[str, Any]]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def is_conversational(prompt: Any) -> bool:
    """A list of `{role, content}` messages (TRL's conversational format)."""
    return not isinstance(prompt, str) and isinstance(prompt, Sequence)


def to_messages(prompt: Prompt, system_prompt: str | None = None) -> Messages:
    """The prompt as messages, with `system_prompt` first unless the prompt has its own."""
    if isinstance(prompt, str):
        messages: Messages = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]
    if system_prompt is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_plain(prompt: Prompt, system_prompt: str | None = None) -> str:
    """The no-template rule: plain text unchanged, else `role: content` lines + `assistant:`."""
    if isinstance(prompt, str) and system_prompt is None:
        return prompt
    lines = [f"{m['role']}: {m['content']}" for m in to_messages(prompt, system_prompt)]
    return "\n".join([*lines, "assistant:"])


def render_prompt(
    prompt: Prompt,
    tokenizer: Any,
    use_chat_template: bool = True,
    system_prompt: str | None = None,
) -> str:
    """The text to generate from (see the module docstring for the rules)."""
    if use_chat_template and has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            to_messages(prompt, system_prompt), tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):  # some tokenizers return a one-item list
            text = text[0]
        return text
    return render_plain(prompt, system_prompt)


class PromptRenderer:
    """`render_prompt` bound to a tokenizer, `task.chat_template` and `task.system_prompt`."""

    def __init__(
        self, tokenizer: Any, use_chat_template: bool = True, system_prompt: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt

    @property
    def uses_template(self) -> bool:
        return self.use_chat_template and has_chat_template(self.tokenizer)

    def __call__(self, prompt: Prompt) -> str:
        return render_prompt(prompt, self.tokenizer, self.use_chat_template, self.system_prompt)


def prompt_fits(tokenizer: Any, text: str, max_positions: int | None, max_new_tokens: int) -> bool:
    """Whether a rendered prompt and `max_new_tokens` fit the model's positions (None: no
    limit known). Training and evaluation skip (and count) the prompts that do not: a model
    fed positions past its table fails with an index error or scores garbage."""
    if not max_positions:
        return True
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return n + max_new_tokens <= max_positions
