"""Generators turn prompts into completions with behaviour log-probs and a policy version."""

from typing import Any

from replayrl.rollout.generation.base import Generator, Sample, SamplingParams
from replayrl.rollout.generation.factory import make_generator

__all__ = ["Generator", "HFGenerator", "Sample", "SamplingParams", "make_generator"]


def __getattr__(name: str) -> Any:
    # lazy: the backends' registry reads this package, and must not import transformers
    if name == "HFGenerator":
        from replayrl.rollout.generation.hf import HFGenerator

        return HFGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
