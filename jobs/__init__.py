"""Everything that runs on the allocated nodes: the job entries submitit pickles and the node
runtime they run (servers, router, load generator, measurements, preflight, tracking)."""
