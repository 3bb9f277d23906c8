"""Producing rollouts: tasks and datasets, prompt rendering, generation backends, reward functions,
the producer that turns prompts into scored Rollouts, and evaluation."""
