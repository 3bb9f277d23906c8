"""Paper 1's (arXiv 2604.08706) buffer design: which buffer size N and replay ratio B / R
minimise compute for a target quality, given the generation/training cost ratio mu.

- `theory`: the closed form and the feasible design (`replayrl design`): the stable core.
- `staleness`, `grad_probe`, `probe`, `auto`: **experimental**: `buffer.capacity=auto`
  measures alpha and rho (and mu) on a warm-up of the run itself and applies `theory`.
"""
