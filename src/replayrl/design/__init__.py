"""Paper 1's (arXiv 2604.08706) buffer design as pure math: which buffer size N and replay
ratio B / R minimise compute for a target quality, given the generation/training cost ratio mu.

- `theory`: the closed form and the feasible design (`replayrl design`): the stable core.
- `staleness`: alpha and rho from per-sample gradients at several staleness levels
  (**experimental**: `buffer.capacity=auto`, whose warm-up is run/loops/probe.py and whose
  decision is run/loops/auto.py).

Imports nothing else from replayrl: the ledger, the run state and the loops all read it.
"""
