"""Test rigs for the project's tests and benchmarks: pytest fixtures with a real nats-server and real service
processes (``fixtures``), the stand-in Kubernetes API server (``k8s_api``, ``k8s_objects``) and cluster-state
builders (``states``). Installed by ``make install`` (editable); never part of the product wheel."""
