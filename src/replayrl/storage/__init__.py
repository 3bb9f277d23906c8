"""Files that outlive a process: atomic writes, pickle-free state (safetensors + JSON) and
checkpoints. The bottom layer: imports nothing else from replayrl."""
