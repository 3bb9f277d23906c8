"""The training loops as plain functions over a `Session` (torchtune's recipes):
`sync.run_sync` (generate -> score -> advantages -> push -> sample -> update) and
`asynchronous.run_async` (generators elsewhere, the learner trains as batches are ready),
both built from `steps` (one generation, one learner step). `auto` and `probe`: the
experimental `buffer.capacity=auto` warm-up that measures mu (alpha, rho) on the run itself
before the sync loop starts. `pool`: what the async loop and its generators exchange."""
