"""The results schema: Point records, the run store and the run manifest (pure, but for
atomic file writes)."""
