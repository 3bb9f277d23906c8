"""Runtimes whose generators or learners run in other processes: async-local generator
processes, Ray actors, weight sync, data-parallel and sharded learners. Above the loops they
drive, below `run.runtimes`, which chooses between them."""
