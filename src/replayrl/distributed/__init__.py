"""Runtimes beyond the synchronous loop: async-local generator processes, Ray actors, weight
sync and data-parallel learners (same layer as run/ and recipes/)."""
