"""The transfer bench's runtime: two NIXL agents over a paged KV buffer (``runner``,
``kv_buffer``, ``nixl_peer``), run by ``jobs/entry/transfer_bench.py`` and the transfer
preflight. Its pure planning (``bench_config``, ``bench_plan``, ``bench_record``) is among
connector's leaves, which the driver may import; this package loads on a task only."""
