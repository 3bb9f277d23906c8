"""One training run: the entry point that picks the runtime, the session (its components, state,
accounting, metrics, callbacks, run folder and checkpoints) and the starting policy.
Data flow: run -> recipes -> (rollout, data, learner) -> (algorithms, models, storage)."""
