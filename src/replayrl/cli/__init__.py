"""The `replayrl` command line: train, eval, bench, design, prepare (top of the data flow:
cli -> run)."""
