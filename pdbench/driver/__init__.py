"""The login node's side effects: launch, executors, progress, sweeps, status, provenance."""
