"""What the driver submits: one picklable callable per kind of job, and nothing it runs.

Each entry holds only what was submitted; calling it on a task of the allocation imports
the node runtime there (``# lazy: node runtime``), so the driver that imports an entry loads
no node-runtime module. ``deployment`` (a Deployment's servers and Points)."""
