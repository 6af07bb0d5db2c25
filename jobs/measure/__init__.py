"""What a Point measures: server counters, attribution, KV occupancy, decode bill, TTFT split."""
