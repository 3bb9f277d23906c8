"""Benchmark tooling on top of everything else: the suites, the speed and buffer benches, the
findings and report scripts, and peers (TRL) run under the same accounting."""
