"""What a run leaves in its dir: Point records and requests (store), the manifest and its
launch history (manifest), the nodes' preflight reports (preflight). Analysis reads these only."""
