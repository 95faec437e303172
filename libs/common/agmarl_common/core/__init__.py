"""The pure core: cluster model, simulator, policies, model inputs, reward and adaptive gate (no I/O)."""
