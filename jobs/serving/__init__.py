"""vLLM server processes, their logs, and the P/D router."""
