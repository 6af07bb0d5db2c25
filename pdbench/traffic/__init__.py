"""Traffic a user brings: traces read, reconstructed into conversations and scaled (pure)."""
