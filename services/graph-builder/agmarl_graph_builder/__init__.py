"""graph-builder: turns snapshots and pending pods into per-pod graph requests (candidates after the
hard filter, plus features) for inference."""
