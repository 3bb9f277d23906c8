"""What a run leaves on disk for a later process to read and check: the run folder's layout,
its lock and config record (`folder`), the signed record of the code it runs (`trust`), and
the rollout ledger and role clocks of its summary (`ledger`)."""
