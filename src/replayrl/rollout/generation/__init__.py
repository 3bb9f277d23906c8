"""Generators turn prompts into completions with behaviour log-probs and a policy version."""

from replayrl.rollout.generation.base import Generator, Sample, SamplingParams
from replayrl.rollout.generation.factory import make_generator
from replayrl.rollout.generation.hf import HFGenerator

__all__ = ["Generator", "HFGenerator", "Sample", "SamplingParams", "make_generator"]
