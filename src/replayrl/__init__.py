"""replayrl: RL post-training of language models that reuses rollouts (replay, ReMix)."""

__version__ = "0.1.0"
