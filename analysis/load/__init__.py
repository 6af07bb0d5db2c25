"""Stage 1: run dirs read into typed records, then frames (``runs``)."""
