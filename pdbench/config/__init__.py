"""The typed run configuration: the schema Hydra composes into, the conf tree, overrides
and the problems validation reports (pure)."""
