"""The learner: one gradient update over a batch of rollouts (log-probs, lean forward,
micro-batches, critic, frozen reference policies), calling the pure losses in
`replayrl.algorithms`."""
