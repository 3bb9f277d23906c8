"""Replay-buffer micro-benchmark (same as `replayrl bench buffer`)."""

from replayrl.buffer.bench import main

if __name__ == "__main__":
    main()
