"""Replay-buffer micro-benchmark (same as `replayrl bench buffer`)."""

from replayrl.bench.buffer import main

if __name__ == "__main__":
    main()
