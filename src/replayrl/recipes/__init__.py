"""The training loops as plain functions over a `Session` (torchtune's recipes):
`sync.run_sync` (generate -> score -> advantages -> push -> sample -> update) and
`asynchronous.run_async` (generators elsewhere, the learner trains as batches are ready)."""
