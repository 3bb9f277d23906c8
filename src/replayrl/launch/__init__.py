"""Start or resume a run: `entry.train` / `entry.resume` check the run folder, then hand the
run to the loop of its runtime (recipes.sync, recipes.asynchronous with local generator
processes, or distributed.ray_runtime). Above the recipes and the runtimes, which it chooses
between, and below the CLI and the Python API, which call it."""
