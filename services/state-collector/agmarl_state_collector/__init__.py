"""state-collector: watches the cluster (Kubernetes API or the simulator) and publishes snapshots,
events and pending pods."""
