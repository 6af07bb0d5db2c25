"""pdbench's login-node side: the CLI, the pure core (config, plan, spec, validate,
results schema) and the driver that submits and follows jobs."""
