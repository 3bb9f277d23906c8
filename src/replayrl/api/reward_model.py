"""A reward model as a reward function, as TRL's GRPOTrainer takes one in `reward_funcs`: a
model folder (or a loaded model) with a sequence-classification head whose first logit
scores prompt + completion, tokenized by its own tokenizer (`reward_processing_classes`).

As in TRL: plain-text prompts are scored on `prompt + completion`; conversational ones on the
conversation (prompt messages + the assistant's reply) rendered with the reward tokenizer's
chat template; the batch is padded on the right with no special tokens added, and the model's
pad token is the tokenizer's, so the head reads each row's last real token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from replayrl.api.replayable import NOT_REPLAYABLE


def is_model_folder(ref: Any) -> bool:
    """A local folder holding a transformers model (config.json)."""
    if not isinstance(ref, (str, Path)):
        return False
    path = Path(ref).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


class RewardModel:
    """`f(prompts, completions, **columns) -> list[float]`: the head's first logit per row.

    `batch_size` rows are scored at a time (memory only)."""

    def __init__(
        self,
        model: torch.nn.Module | str | Path,
        tokenizer: Any = None,
        batch_size: int = 32,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        source = model
        if not isinstance(model, torch.nn.Module):
            # TRL loads a reward model id with num_labels=1: one score per sequence
            model = AutoModelForSequenceClassification.from_pretrained(
                str(Path(model).expanduser()), num_labels=1
            )
        config = getattr(model, "config", None)
        if config is None or not hasattr(model, "forward"):
            raise TypeError(f"a reward model needs a transformers model, got {type(model)}")
        where = getattr(config, "name_or_path", "") or str(source)
        if tokenizer is None:
            if not is_model_folder(where):
                raise ValueError(
                    f"reward model {where!r}: give its tokenizer in reward_processing_classes"
                )
            tokenizer = AutoTokenizer.from_pretrained(where)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # the head scores the last token that is not padding: it finds it by this id
        config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.name = str(where).rstrip("/").split("/")[-1] or "reward_model"
        self.__name__ = self.name  # the metric's name, reward/<name>, as TRL names it
        self.source = str(where)

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """What the model reads: prompt + completion, or the rendered conversation."""
        out = []
        for p, c in zip(prompts, completions, strict=True):
            if isinstance(p, list):  # messages (and the completion as an assistant message)
                reply = c if isinstance(c, list) else [{"role": "assistant", "content": c}]
                out.append(self.tokenizer.apply_chat_template(p + reply, tokenize=False))
            else:
                out.append(str(p) + str(c))
        return out

    @torch.inference_mode()
    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                text=texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            ).to(device)
            scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores

    def record(self) -> str:
        """config.yaml's entry: where the model came from, and that the command line cannot
        load it by that name (no ':' in it: resume checks read one as a code reference)."""
        return (
            f"{NOT_REPLAYABLE} - the reward model {self.source.replace(':', '.')} is given to "
            "ReplayTrainer; pass it again to resume>"
        )


def as_reward_models(funcs: list[Any], processing_classes: Any) -> list[Any]:
    """`funcs` with each model (object, or local model folder) wrapped as a `RewardModel`
    with its entry of `processing_classes` (TRL's reward_processing_classes: one, or one per
    reward function; entries of other functions are ignored)."""
    if processing_classes is None:
        classes: list[Any] = [None] * len(funcs)
    elif isinstance(processing_classes, (list, tuple)):
        classes = list(processing_classes)
    else:
        classes = [processing_classes]
    if len(classes) != len(funcs):
        raise ValueError(
            f"reward_processing_classes has {len(classes)} entries for {len(funcs)} reward "
            "functions (as in TRL: one per reward function, None for functions)"
        )
    return [
        RewardModel(fn, tok) if isinstance(fn, torch.nn.Module) or is_model_folder(fn) else fn
        for fn, tok in zip(funcs, classes, strict=True)
    ]
