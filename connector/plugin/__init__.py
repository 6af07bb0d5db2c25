"""The vLLM side: what vLLM loads inside each server (the NIXL connector subclass, its
tracing and timing, D's KV-params service, the CPU engine tweaks) and the general plugin
every vLLM process loads (``engine_start``). It imports only connector's leaves."""
