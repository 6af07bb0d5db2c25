"""Pure planning: a RunConfig becomes Deployments x Points, with identities and a run order."""
