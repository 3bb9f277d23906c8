"""One training run's session: its components, state, accounting, metrics, callbacks, run
folder and checkpoints, and the starting policy. The loops that drive a session are
recipes/; launch/ picks the runtime.
Data flow: launch -> recipes -> run -> (rollout, data, learner) -> (algorithms, models, storage)."""
