"""A run's life, in one wing: `start` checks the run folder and hands the run to its
runtime (`runtimes`: the sync loop, local generator processes, or Ray actors in
`distributed/`); `loops/` are the training loops as plain functions over a `Session`;
`session` and its parts (components, state, metrics, callbacks, the starting policy) are one
run in memory; `records/` is what it leaves on disk (folder, ledger, signed record).
Data flow: start -> runtimes -> distributed -> loops -> session -> (methods, rollout, data,
learner) -> (algorithms, models, storage)."""
