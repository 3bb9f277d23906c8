"""The Python API users start from: ReplayTrainer and ReplayConfig, shaped like TRL's GRPOTrainer
and GRPOConfig (top of the data flow: api -> run)."""
