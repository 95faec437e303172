"""adaptive-engine: owns the active-policy selection (KV), watches rewards and workload statistics,
raises drift alerts and retrain requests."""
